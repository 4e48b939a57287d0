"""pytest under mpirun: every rank runs the same tests in the same order
(each test is collective), one phase a job:

    mpirun -np N python -m pytest python/tests/test_runtime.py -k test_write --store DIR
    mpirun -np N python -m pytest python/tests/test_runtime.py -k test_restart --store DIR
    mpirun -np 1 python -m pytest python/tests/test_runtime.py -k test_resize --store DIR --old-ranks N

A failed check aborts the whole job (`MPI_Abort`), naming the rank and
what failed: a rank that raised alone would leave the others waiting in a
collective.
"""

import pytest


def pytest_addoption(parser):
    parser.addoption("--store", default=None, help="the directory the phases write and read")
    parser.addoption("--old-ranks", type=int, default=None, help="ranks of the job that wrote --store (resize)")


def _given(request, option, why):
    """The value of `option`, or the test skipped saying what to give."""
    value = request.config.getoption(option)
    if value is None:
        pytest.skip(why)
    return value


@pytest.fixture
def store(request):
    return _given(request, "--store", "a phase of a job: give --store DIR")


@pytest.fixture
def old_ranks(request):
    return _given(request, "--old-ranks", "the resize phase: give --old-ranks N")
