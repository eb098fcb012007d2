terraform {
  # 1.9: validations that refer to other variables.
  required_version = ">= 1.9, < 2.0"
}
