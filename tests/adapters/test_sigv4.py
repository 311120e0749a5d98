"""The direct path's SigV4 header is botocore's, byte for byte, for the requests it sends.

Each case signs the same POST with botocore's ``SigV4Auth`` (its clock fixed) and with
``sigv4.Scope`` at the same timestamp, and compares every header both add.
"""

from __future__ import annotations

import datetime

import pytest
from botocore import auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from kclasync._adapters.sigv4 import Scope

WHEN = datetime.datetime(2026, 11, 23, 23, 59, 58)
STAMP = "20261123T235958Z"
BODY = b'{"TableName":"t","Key":{"leaseKey":{"S":"shardId-000000000001"}},"ReturnValues":"ALL_NEW"}'


def _headers() -> dict[str, str]:
    return {
        "X-Amz-Target": "DynamoDB_20120810.UpdateItem",
        "Content-Type": "application/x-amz-json-1.0",
        "User-Agent": "aiobotocore/3.10.0 md/Botocore#1.43.117 ua/2.1  os/linux",
        "X-Amzn-Trace-Id": "Root=1-5759e988-bd862e3fe1be46a994272793;Sampled=1",
        "amz-sdk-invocation-id": "1a2b3c4d-0000-4000-8000-000000000000",
        "amz-sdk-request": "attempt=1;  max=3",
    }


@pytest.mark.parametrize(
    ("url", "region", "service", "token"),
    [
        ("http://127.0.0.1:5123", "us-east-1", "dynamodb", None),
        ("https://dynamodb.eu-west-1.amazonaws.com", "eu-west-1", "dynamodb", "tok/en+=="),
        ("https://kinesis.us-west-2.amazonaws.com:443/", "us-west-2", "kinesis", None),
        ("https://123456789012.ddb.us-east-1.amazonaws.com/a/../b/", "us-east-1", "dynamodb", "t"),
        ("http://[::1]:4567", "ap-south-1", "kinesis", "session"),
    ],
)
def test_same_authorization_as_botocore(
    monkeypatch: pytest.MonkeyPatch, url: str, region: str, service: str, token: str | None
) -> None:
    monkeypatch.setattr(auth, "get_current_datetime", lambda *a, **k: WHEN)
    creds = Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token)
    theirs = AWSRequest(method="POST", url=url, data=BODY, headers=_headers())
    auth.SigV4Auth(creds.get_frozen_credentials(), service, region).add_auth(theirs)

    scope = Scope(url, region, service)
    for _ in range(2):  # the second uses the cached signing key
        ours = _headers()
        scope.sign(ours, BODY, STAMP, creds.access_key, creds.secret_key, token)
        assert ours == dict(theirs.headers.items())
        assert ours["Authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/2026")


def test_another_day_or_secret_gets_another_key() -> None:
    scope = Scope("http://127.0.0.1:1", "us-east-1", "kinesis")
    signatures = set()
    for stamp, secret in [(STAMP, "a"), ("20261124T000001Z", "a"), (STAMP, "b")]:
        headers = _headers()
        scope.sign(headers, BODY, stamp, "AK", secret, None)
        signatures.add(headers["Authorization"].rsplit("=", 1)[1])
    assert len(signatures) == 3


def test_a_query_string_is_left_to_botocore() -> None:
    with pytest.raises(ValueError, match="query string"):
        Scope("https://example.com/?x=1", "us-east-1", "kinesis")
