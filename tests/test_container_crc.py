"""The container's CRC-32: ISA-L's when installed, zlib's otherwise, with the same values."""
import os
import subprocess
import sys
import zlib

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from inshrink.container import layout


@given(st.binary(max_size=20000), st.integers(0, 63))
def test_crc32_equals_zlib_on_any_buffer(data, skip):
    view = memoryview(data)[min(skip, len(data)):]
    assert layout.crc32(data) == zlib.crc32(data) & 0xFFFFFFFF
    assert layout.crc32(view) == zlib.crc32(view) & 0xFFFFFFFF
    assert layout.crc32(np.frombuffer(data, np.uint8)) == zlib.crc32(data) & 0xFFFFFFFF


def test_isal_is_used_where_installed():
    try:
        import isal.isal_zlib
    except ImportError:  # the fallback is what this interpreter runs; the next test covers it
        assert layout._crc32 is zlib.crc32
    else:
        assert layout._crc32 is isal.isal_zlib.crc32


def test_without_isal_files_still_write_and_read(tmp_path):
    """Blocking the import of isal falls back to zlib.crc32; files stay interchangeable."""
    import inshrink
    state = {"w": np.linspace(-1, 1, 30000, dtype=np.float32)}
    inshrink.save(tmp_path / "a.ink", state)
    script = f"""
import sys, zlib
sys.modules["isal"] = None  # import isal now raises ImportError
import numpy as np, inshrink
from inshrink.container import layout
assert layout._crc32 is zlib.crc32
assert np.array_equal(inshrink.load({str(tmp_path / "a.ink")!r})["w"],
                      np.linspace(-1, 1, 30000, dtype=np.float32))
inshrink.save({str(tmp_path / "b.ink")!r}, {{"w": np.linspace(-1, 1, 30000, dtype=np.float32)}})
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=300, env=dict(os.environ))
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "a.ink").read_bytes() == (tmp_path / "b.ink").read_bytes()
