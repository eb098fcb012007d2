from tests.integration.conftest import jobs  # noqa: F401  (the fixture that kills what a test leaves running)
