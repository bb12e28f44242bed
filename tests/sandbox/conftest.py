from tests.sandbox_fixtures import kubectl, sandbox, sandbox_client, sandbox_cluster  # noqa: F401
