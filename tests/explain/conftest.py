from tests.sandbox_fixtures import sandbox, sandbox_client  # noqa: F401
