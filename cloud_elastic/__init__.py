"""cloud-elastic: elastic PyTorch training on cloud autoscaling groups.

The driver side lives in :mod:`cloud_elastic.driver`, discovery providers in
:mod:`cloud_elastic.providers`, and the worker API users import in
:mod:`cloud_elastic.torch`. Importing this package imports neither torch nor
any cloud SDK.
"""

__version__ = "0.1.0"
