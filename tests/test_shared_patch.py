"""SharedPatch: installed by the first of nested or concurrent blocks, removed after the last."""

from __future__ import annotations

import threading

import pytest

from remote_partitioner.proto.codec.shared_patch import SharedPatch


def _recording() -> tuple[SharedPatch, list[str]]:
    events: list[str] = []
    return SharedPatch(lambda: events.append("install"), lambda: events.append("uninstall")), events


def test_nested_blocks_install_once_and_uninstall_after_the_last() -> None:
    patch, events = _recording()
    with patch():
        with patch():
            assert events == ["install"] and patch.active
        assert events == ["install"] and patch.active
    assert events == ["install", "uninstall"] and not patch.active
    with patch():  # a later block installs again
        pass
    assert events == ["install", "uninstall", "install", "uninstall"]


def test_uninstalled_when_the_block_raises() -> None:
    patch, events = _recording()
    with pytest.raises(ValueError), patch():
        raise ValueError("in the block")
    assert events == ["install", "uninstall"] and not patch.active


def test_a_failed_install_leaves_the_count_unchanged() -> None:
    calls: list[str] = []

    def install() -> None:
        calls.append("install")
        if len(calls) == 1:
            raise RuntimeError("first install fails")

    patch = SharedPatch(install, lambda: calls.append("uninstall"))
    with pytest.raises(RuntimeError), patch():
        pass  # pragma: no cover - not entered
    assert not patch.active
    with patch():
        assert patch.active
    assert calls == ["install", "install", "uninstall"]


def test_concurrent_blocks_share_one_install() -> None:
    patch, events = _recording()
    inside = threading.Barrier(4, timeout=10)
    leave = threading.Event()
    seen: list[bool] = []

    def block() -> None:
        with patch():
            inside.wait()
            seen.append(patch.active)
            assert leave.wait(timeout=10)

    threads = [threading.Thread(target=block) for _ in range(3)]
    for t in threads:
        t.start()
    inside.wait()  # all three are inside their blocks
    assert events == ["install"]
    leave.set()
    for t in threads:
        t.join(timeout=10)
    assert not any(t.is_alive() for t in threads)
    assert seen == [True, True, True]
    assert events == ["install", "uninstall"] and not patch.active
