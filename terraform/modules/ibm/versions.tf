terraform {
  required_version = ">= 1.9, < 2.0"

  required_providers {
    ibm = {
      source  = "IBM-Cloud/ibm"
      version = ">= 1.60, < 2.0"
    }
  }
}
