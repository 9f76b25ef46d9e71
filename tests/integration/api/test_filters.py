"""``POST /v1/projects/{p}/filters/test``: a filter judged against a sample message as
delivery judges it."""

from __future__ import annotations

import base64

import pytest

from tests.integration.api.support import Api, assert_error, unique

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

PAID_EU = {
    "all": [
        {"header": "X_REGION", "prefix": "eu-"},
        {"body": "order.total", "gte": 100},
        {"not": {"body": "order.currency", "equals": "USD"}},
    ]
}


async def judge(api: Api, project: str, **sample: object) -> bool:
    answer = await api.client.post(f"/v1/projects/{project}/filters/test", json=sample)
    assert answer.status_code == 200, answer.text
    return bool(answer.json()["matches"])


async def test_a_filter_is_judged_on_a_samples_headers_and_json_body(
    api: Api, project: str
) -> None:
    body = '{"order": {"total": 120, "currency": "EUR"}}'
    headers = {"X_REGION": "eu-west"}
    assert await judge(api, project, filter=PAID_EU, body=body, headers=headers) is True
    cheap = '{"order": {"total": 20, "currency": "EUR"}}'
    assert await judge(api, project, filter=PAID_EU, body=cheap, headers=headers) is False
    # A body that is not JSON never matches a body condition (base64 for any bytes)
    binary = base64.b64encode(b"\x00\xff total=120").decode()
    body_test = {"body": "order.total", "exists": False}
    assert await judge(api, project, filter=body_test, body_base64=binary) is False
    # The GroupId is a header like the others
    by_group = {"header": "X_GROUP_ID", "equals": "g-1"}
    assert await judge(api, project, filter=by_group, body="{}", group_id="g-1") is True


async def test_a_broken_filter_or_sample_is_400_naming_it(api: Api, project: str) -> None:
    path = f"/v1/projects/{project}/filters/test"
    broken = await api.client.post(path, json={"filter": {"body": "a", "gte": "x"}, "body": "{}"})
    assert_error(broken, 400, "invalid_input")
    assert "filter.gte: must be a number" in broken.json()["error"]["message"]
    both = await api.client.post(
        path, json={"filter": {"body": "a", "exists": True}, "body": "{}", "body_base64": "e30="}
    )
    assert_error(both, 400, "invalid_input")
    header = await api.client.post(
        path, json={"filter": {"body": "a", "exists": True}, "body": "{}", "headers": {"A": "b"}}
    )
    assert_error(header, 400, "invalid_input")


async def test_an_unknown_project_is_404(api: Api) -> None:
    answer = await api.client.post(
        f"/v1/projects/{unique()}/filters/test",
        json={"filter": {"body": "a", "exists": True}, "body": "{}"},
    )
    assert_error(answer, 404, "not_found")
