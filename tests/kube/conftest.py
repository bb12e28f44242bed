from tests.sandbox_fixtures import kubectl, sandbox, sandbox_client  # noqa: F401
