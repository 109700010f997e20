"""Which attention kernel ballast picks, checked without a GPU."""
from __future__ import annotations

import sys
import types

import pytest

from ballast.models import kernels


def _fake_flash_attn(monkeypatch, version: str) -> object:
    """An installed `flash_attn` of this version (a stand-in module); returns its varlen function."""
    def varlen(*args, **kwargs):  # pragma: no cover - never called: only picked or refused
        raise AssertionError("the stand-in is not a kernel")

    module = types.ModuleType("flash_attn")
    module.__version__ = version
    module.flash_attn_varlen_func = varlen
    monkeypatch.setitem(sys.modules, "flash_attn", module)
    return varlen


@pytest.fixture(autouse=True)
def fresh_choice():
    kernels.flash_attn_varlen.cache_clear()
    yield
    kernels.flash_attn_varlen.cache_clear()  # the real module's answer, for the tests after


@pytest.mark.parametrize("version", ["2.1.0", "2.6.3", "2.8.0.post2", "3.0.0b1"])
def test_flash_attn_from_2_1_is_used(monkeypatch, version):
    varlen = _fake_flash_attn(monkeypatch, version)
    assert kernels.flash_attn_varlen() is varlen


@pytest.mark.parametrize("version", ["2.0.9", "1.0.9", "2.0.0.post1"])
def test_flash_attn_before_2_1_is_refused_with_a_warning(monkeypatch, version):
    # Before 2.1 flash-attn's causal mask is top-left: context parallelism would be silently wrong.
    _fake_flash_attn(monkeypatch, version)
    with pytest.warns(UserWarning, match=f"flash-attn {version} is older than 2.1"):
        assert kernels.flash_attn_varlen() is None


def test_no_flash_attn_is_no_kernel(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn", None)  # `import flash_attn` raises ImportError
    assert kernels.flash_attn_varlen() is None
