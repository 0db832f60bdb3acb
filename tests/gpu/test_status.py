"""How the GPU evaluator reads a CUDA status (`tuner.gpu.status`), with CuPy's own exception types and no GPU:
which statuses poison the context, which refuse a launch, and the failure each becomes."""

from __future__ import annotations

import pytest
from cupy_backends.cuda.api import driver, runtime

from tuner.core.result import LaunchFailed
from tuner.gpu import status as cuda_status


@pytest.mark.parametrize("status", [700, 714, 715, 716, 718, 719])
def test_context_poisoning_statuses_are_sticky(status):
    assert cuda_status.classify_status(status) == "sticky"


@pytest.mark.parametrize("status", [1, 200, 209, 218, 500, 701])
def test_refused_launch_statuses_are_not_sticky(status):
    assert cuda_status.classify_status(status) == "launch"


@pytest.mark.parametrize("status", [None, 0, 3, 600, 801])
def test_other_statuses_are_not_ours(status):
    assert cuda_status.classify_status(status) is None


def test_status_numbers_match_the_cuda_runtime_names():
    """Guards the tables against a typo: the runtime names each code itself (no driver needed for that)."""
    expected = {
        700: "cudaErrorIllegalAddress",
        714: "cudaErrorHardwareStackError",
        715: "cudaErrorIllegalInstruction",
        716: "cudaErrorMisalignedAddress",
        718: "cudaErrorInvalidPc",
        719: "cudaErrorLaunchFailure",
        1: "cudaErrorInvalidValue",
        200: "cudaErrorInvalidKernelImage",
        209: "cudaErrorNoKernelImageForDevice",
        701: "cudaErrorLaunchOutOfResources",
        600: "cudaErrorNotReady",
    }
    for status, name in expected.items():
        assert str(runtime.CUDARuntimeError(status)).startswith(name + ":")


def test_runtime_error_becomes_a_sticky_launch_failure():
    failure = cuda_status.cuda_failure(runtime.CUDARuntimeError(700), "launch")
    assert isinstance(failure, LaunchFailed)
    assert failure.details["status"] == 700 and failure.details["sticky"] is True
    assert failure.reason.startswith("launch: CUDA error 700 (illegal address)")


def test_driver_error_becomes_a_non_sticky_launch_failure():
    # CUDADriverError's constructor asks libcuda for the name; without a driver, build it around its status.
    exc = driver.CUDADriverError.__new__(driver.CUDADriverError)
    exc.status = 701
    failure = cuda_status.cuda_failure(exc, "launch")
    assert failure.details == {**failure.details, "status": 701, "sticky": False}
    assert "too many resources" in failure.reason


def test_unexpected_status_is_left_to_propagate():
    assert cuda_status.cuda_failure(runtime.CUDARuntimeError(3), "launch") is None
