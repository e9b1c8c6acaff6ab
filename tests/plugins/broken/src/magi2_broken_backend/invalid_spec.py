"""Returns a descriptor that does not validate (an unknown op, no device types)."""


def magi2_backend() -> dict[str, object]:
    return {
        "name": "magi2-backend-broken-spec",
        "version": "0.0.1",
        "core_api": ">=2.0,<3",
        "providers": [{"op": "convolution", "name": "bad", "impl": "x:y", "dtypes": ["float32"]}],
    }
