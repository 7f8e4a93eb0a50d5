"""Declared requirements of the wheels runtime/vendor.py pins (extracted data).

Source: each wheel's `*.dist-info/METADATA` (Requires-Dist lines without an extra), from
PyPI, read once with
    pip download --no-deps --python-version 3.12 --implementation cp \\
        --platform manylinux2014_x86_64 --only-binary=:all: boto3==1.44.8 botocore==1.44.8 \\
        s3transfer==0.19.3 jmespath==1.1.0 ruamel.yaml==0.19.1 uvloop==0.21.0
on 2026-12-01; the sha256 column is `sha256sum` of those files. ruamel.yaml 0.19.1 needs
ruamel.yaml.clib only for its "oldlibyaml" extra, so it is no longer vendored.
"""

WHEELS = {
    "boto3": {"version": "1.44.8", "sha256": "099caf21553bbbfef118904aa02fadb8776a534704cf00bede0ed9f29a4da88e",
              "requires": ["botocore<1.45.0,>=1.44.8", "jmespath<2.0.0,>=0.7.1", "s3transfer<0.20.0,>=0.19.0"]},
    "botocore": {"version": "1.44.8", "sha256": "76342a76c338701db80dcb8afe1c9bd079283d6fffbb9d881442abb02a215043",
                 "requires": ["jmespath<2.0.0,>=0.7.1", "python-dateutil<3.0.0,>=2.1", "urllib3!=2.2.0,<3,>=1.25.4"]},
    "s3transfer": {"version": "0.19.3", "sha256": "24eb7535804306355e31c952a90022bf5b2f9d760f9a11062c7493a217c08553",
                   "requires": ["botocore<2.0a.0,>=1.37.4"]},
    "jmespath": {"version": "1.1.0", "sha256": "a5663118de4908c91729bea0acadca56526eb2698e83de10cd116ae0f4e97c64",
                 "requires": []},
    "ruamel.yaml": {"version": "0.19.1", "sha256": "27592957fedf6e0b62f281e96effd28043345e0e66001f97683aa9a40c667c93",
                    "requires": []},
    "uvloop": {"version": "0.21.0", "sha256": "86975dca1c773a2c9864f4c52c5a55631038e387b47eaf56210f873887b6c8dc",
               "requires": []},
}

# Requirements the release image itself satisfies (TensorRT-LLM's own requirements; vendoring
# them would shadow the image's copies for TensorRT-LLM too).
IMAGE_PROVIDED = frozenset({"python-dateutil", "urllib3"})
