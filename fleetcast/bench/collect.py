"""`fleetcast bench collect`: download the results files benchmark instances
uploaded to S3 (`s3://BUCKET/PREFIX.../*.json`), validating each against the
results schema so the planner only ever sees well-formed files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fleetcast.bench.schema import SCHEMA_ID
from fleetcast.contract.errors import UserError


def collect(bucket: str, prefix: str, out: Path, *, region: str | None = None,
            endpoint_url: str | None = None, client: Any = None, profile: str | None = None) -> list[Path]:
    """Download every `*.json` results file under the prefix into `out`, keeping
    the key's path below the prefix. Files that are not bench results are skipped
    with a note on stderr; returns the written paths."""
    import sys

    from botocore.exceptions import BotoCoreError, ClientError

    from fleetcast.aws_session import AwsSession, translate
    from fleetcast.bench.schema import Results

    s3 = client or AwsSession(profile, region).client("s3", endpoint_url=endpoint_url)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    try:
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        keys = [obj["Key"] for page in pages for obj in page.get("Contents", ()) if obj["Key"].endswith(".json")]
    except (BotoCoreError, ClientError) as exc:
        # Missing access is exit 4; anything else (no such bucket) is the --bucket given, exit 1.
        error = translate(exc, service="s3", operation="ListObjectsV2", region=region, other_exit=1)
        raise UserError(f"--bucket {bucket}: cannot list {prefix!r}: {error}", error.exit_code) from None
    for key in keys:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        try:
            data = json.loads(body)
            if data.get("schema") != SCHEMA_ID:
                raise ValueError(f"schema {data.get('schema')!r}")
            Results.model_validate(data)
        except (ValueError, AttributeError) as exc:
            print(f"skipping s3://{bucket}/{key}: not a {SCHEMA_ID} results file ({str(exc)[:120]})", file=sys.stderr)
            continue
        rel = key[len(prefix):].lstrip("/") if key.startswith(prefix) else key
        dest = (out / rel).resolve()
        if out.resolve() not in dest.parents:
            print(f"skipping s3://{bucket}/{key}: key escapes the output directory", file=sys.stderr)
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(body)
        written.append(dest)
    return written


def upload(results_path: Path, bucket: str, key: str, *, region: str | None = None,
           endpoint_url: str | None = None, client: Any = None) -> str:
    """Upload one results file (used on benchmark instances); returns its s3:// URI."""
    import boto3

    s3 = client or boto3.client("s3", region_name=region, endpoint_url=endpoint_url)
    # The bucket's default encryption applies (the fleet's buckets enforce it).
    s3.put_object(Bucket=bucket, Key=key, Body=Path(results_path).read_bytes(), ContentType="application/json")
    return f"s3://{bucket}/{key}"
