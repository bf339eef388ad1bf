"""Triton's CPU interpreter for a test module (imported first thing by tests/test_kernels.py, test_decode.py and
test_w4a16.py). The interpreter is chosen when triton is first imported (triton.language decorates its helpers
then) and is read again lazily while kernels run, so the variable is set before any import of triton and again
while the module's tests run; afterwards it is put back. The module is skipped where Triton is not installed (CI)
or was imported without the interpreter (run the file alone then)."""
import os
import sys

import pytest

_old = os.environ.get("TRITON_INTERPRET")


def restore() -> None:
    if _old is None:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = _old


def interpreter_or_skip(*first: str) -> None:
    """Call at a test module's top, before it imports triton; `first`: modules that must not be imported yet."""
    if "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        pytest.importorskip("triton")
        if os.environ.get("TRITON_INTERPRET") != "1" or any(m in sys.modules for m in first):
            pytest.skip(f"triton (or one of {first}) was imported without TRITON_INTERPRET=1: run this file alone",
                        allow_module_level=True)
    except pytest.skip.Exception:
        restore()
        raise


@pytest.fixture(scope="module", autouse=True)
def interpreter_env():
    """Autouse where imported: the interpreter on while the module's tests run (an earlier module may have
    restored it)."""
    os.environ["TRITON_INTERPRET"] = "1"
    yield
    restore()
