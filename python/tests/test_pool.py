"""Pools, arenas and blocks through the binding."""

from __future__ import annotations

import numpy as np
import pytest

import cxlkv
from cxlkv.errors import (
    BufferMismatchError,
    ClosedError,
    DoubleFreeError,
    ExistsError,
    InvalidArgumentError,
    MismatchError,
    NotFoundError,
)
from conftest import ShmFiles

LAYOUT = cxlkv.KvLayout(layers=2, kv_heads=2, head_dim=64, dtype_bytes=2, tokens_per_block=16)


def test_create_open_alloc_write_free(shm: ShmFiles) -> None:
    spec = f"file:{shm.path('pool')}?size=16M"
    with cxlkv.Pool.open(spec) as pool, cxlkv.Arena.create(pool, LAYOUT) as arena:
        assert arena.block_size() == LAYOUT.block_bytes == 16384
        assert arena.block_size(5) == 0
        st = arena.stats()
        assert st.classes[0].block_bytes == LAYOUT.block_bytes
        total = st.classes[0].total_blocks
        assert total > 0 and st.owners_active == 1
        b = arena.alloc()
        assert arena.ref_to_addr(b.ref) == b.addr
        data = np.arange(LAYOUT.block_bytes, dtype=np.uint8)
        arena.write(b, data)
        assert np.array_equal(np.ctypeslib.as_array(
            (np.ctypeslib.ctypes.c_uint8 * LAYOUT.block_bytes).from_address(b.addr)), data)
        assert arena.stats().classes[0].allocs == 1
        arena.free(b)
        with pytest.raises(DoubleFreeError, match="double free") as e:
            arena.free(b)
        assert "CXLKV_E_DOUBLE_FREE" in str(e.value) and "Arena(" in str(e.value)
    # Reopened in the same source: same uuid, the layout checked.
    with cxlkv.Pool.open(spec.split("?")[0]) as pool:
        with cxlkv.Arena.open(pool, expect=LAYOUT) as arena:
            assert arena.stats().classes[0].total_blocks == total
        other = cxlkv.KvLayout(1, 1, 64, 2, 16)
        with pytest.raises(MismatchError):
            cxlkv.Arena.open(pool, expect=other)


def test_format_twice_needs_force(shm: ShmFiles) -> None:
    spec = f"file:{shm.path('pool')}?size=8M"
    with cxlkv.Pool.open(spec) as pool:
        cxlkv.Arena.create(pool, LAYOUT).close()
        with pytest.raises(ExistsError) as e:
            cxlkv.Arena.create(pool, LAYOUT)
        assert isinstance(e.value, FileExistsError)
        assert "force=True" in str(e.value)
        a = cxlkv.Arena.create(pool, LAYOUT, force=True, class_tokens=[16, 64],
                               class_weights=[1, 1])
        assert a.block_size(1) == 4 * LAYOUT.block_bytes
        a.close()


def test_closed_handles_raise_and_pool_close_closes_the_arena(shm: ShmFiles) -> None:
    pool = cxlkv.Pool.open(f"file:{shm.path('pool')}?size=8M")
    arena = cxlkv.Arena.create(pool, LAYOUT)
    pool.close()
    assert arena.closed
    with pytest.raises(ClosedError, match="is closed") as e:
        arena.alloc()
    assert "Arena.open" in str(e.value)
    with pytest.raises(ClosedError):
        cxlkv.Arena.open(pool)
    pool.close()  # idempotent


def test_bad_specs_and_layouts(shm: ShmFiles) -> None:
    with pytest.raises(NotFoundError, match="does not exist") as e:
        cxlkv.Pool.open(f"file:{shm.path('missing')}")
    assert "Pool(file:" in str(e.value)
    with pytest.raises(InvalidArgumentError, match="non-empty"):
        cxlkv.Pool.open("")
    with pytest.raises(InvalidArgumentError):
        cxlkv.Pool.open("nosuchkind:/x")
    with cxlkv.Pool.open(f"file:{shm.path('pool')}?size=8M") as pool:
        with pytest.raises(InvalidArgumentError, match="layers"):
            cxlkv.Arena.create(pool, cxlkv.KvLayout(0, 1, 1, 1, 1))
        with pytest.raises(InvalidArgumentError, match="size classes"):
            cxlkv.Arena.create(pool, LAYOUT, class_tokens=[16] * 9)


def test_write_checks_the_block_size(shm: ShmFiles) -> None:
    with cxlkv.Pool.open(f"file:{shm.path('pool')}?size=8M") as pool:
        with cxlkv.Arena.create(pool, LAYOUT) as arena:
            b = arena.alloc()
            with pytest.raises(InvalidArgumentError, match="do not fit"):
                arena.write(b, np.zeros(LAYOUT.block_bytes + 1, np.uint8))
            with pytest.raises(BufferMismatchError, match="not C-contiguous"):
                arena.write(b, np.zeros((64, 64), np.uint8)[:, ::2])
            arena.write(b, b"\x01\x02\x03", offset=LAYOUT.block_bytes - 3)
