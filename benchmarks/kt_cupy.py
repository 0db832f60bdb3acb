"""Kernel Tuner's CuPy backend on an H200: the one work-around its benchmarks need, in a module that imports
nothing, so that a Kernel Tuner child process pays for no import of ours."""


def pad_device_uuid(cupy) -> None:
    """CuPy returns the device UUID (16 raw bytes) cut at its first zero byte, and Kernel Tuner's CuPy backend
    builds ``uuid.UUID(bytes=...)`` from it, which raises on a GPU whose UUID holds a zero byte (some H200s do).
    Pad it back to 16 bytes (with zeros: exact when the cut bytes were zeros, a stand-in otherwise; Kernel Tuner
    only records it). Touches nothing that is timed."""
    get = cupy.cuda.runtime.getDeviceProperties

    def padded(device: int):
        props = dict(get(device))
        uuid = props.get("uuid")
        if isinstance(uuid, bytes) and len(uuid) < 16:
            props["uuid"] = uuid.ljust(16, b"\0")
        return props

    cupy.cuda.runtime.getDeviceProperties = padded
