"""The JSON schema of ``GpuConfig`` as published in ``api/gpuconfig.schema.json``.

Generated from the pydantic model so that the schema and the validation the webhook and the
controller apply can never drift apart; ``hack/gen-schema.py`` writes it and a test fails when the
committed file is stale.
"""

from __future__ import annotations

import json
from typing import Any

from dra_driver.config.model import GpuConfig

SCHEMA_ID = "https://gpu.hami.io/schemas/v1alpha1/gpuconfig.schema.json"


def gpu_config_schema() -> dict[str, Any]:
    schema = GpuConfig.model_json_schema(mode="validation")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID, **schema}


def render_schema() -> str:
    """The file's exact text: sorted keys, two-space indent, trailing newline."""
    return json.dumps(gpu_config_schema(), indent=2, sort_keys=True) + "\n"
