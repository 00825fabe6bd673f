"""PUT api/quotas' ``user_limits`` in the OpenAPI document says what the queue file's parser
accepts (core/user_limits.py): a body the schema calls valid is not refused as malformed, so
Schemathesis' "schema-valid request rejected" check holds for it (CI once drew such a body: an
unknown field in a user's limits, which the open schema allowed)."""

from __future__ import annotations

import jsonschema
import pytest

from jupyter_gpusched.core.errors import ConfigError
from jupyter_gpusched.core.user_limits import parse_user_limits
from jupyter_gpusched.service.openapi_requests import QUOTAS_REQUEST

SCHEMA = QUOTAS_REQUEST["properties"]["user_limits"]

CASES = [
    None,
    {},
    {"default": {"gpus": 4, "running_jobs": 2, "pending_jobs": 10}},
    {"alice": {"gpus": 0.5}, "bob": {}, "carol": {"pending_jobs": None}},
    {"alice": {"gpus": -1}},
    {"alice": {"running_jobs": 1.5}},
    {"alice": {"jobs": 3}},  # an unknown field
    {"\u0095": {"2g\u00a2\u0085": {}}},  # the body CI drew
    {"alice": 3},
    {"alice": {"gpus": True}},
    {"alice": {"pending_jobs": "2"}},
]


def schema_accepts(value) -> bool:
    return jsonschema.Draft202012Validator(SCHEMA).is_valid(value)


def parser_accepts(value) -> bool:
    try:
        parse_user_limits(value, "api/quotas", {"user_limits": value})
    except ConfigError:
        return False
    return True


@pytest.mark.parametrize("value", CASES, ids=[repr(c)[:40] for c in CASES])
def test_the_schema_and_the_parser_agree(value):
    assert schema_accepts(value) == parser_accepts(value), value
