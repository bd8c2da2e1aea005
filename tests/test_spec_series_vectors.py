"""The series vectors of spec section 23.3: weights-only steps, read from a copy."""
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from inshrink.dtypes import of_numpy
from inshrink.errors import CorruptError
from inshrink.series import Series

VECTORS = Path(__file__).resolve().parent.parent / "spec" / "vectors" / "series"


@pytest.fixture
def series_dir(tmp_path):
    target = tmp_path / "weights_only"
    shutil.copytree(VECTORS / "weights_only", target)  # opening takes a lock file
    return target


def test_the_weights_only_vector_decodes_to_its_expected_tensors(series_dir):
    expected = json.loads((VECTORS / "weights_only.expected.json").read_text())
    series = Series(series_dir)
    assert series.weights_only_steps() == expected["weights_only"] == [2, 3]
    assert [str(s) for s in series.steps()] == list(expected["steps"])
    for step, tensors in expected["steps"].items():
        got = series.load(int(step))
        assert sorted(got) == sorted(tensors)
        for name, want in tensors.items():
            array = got[name]
            assert of_numpy(array.dtype).name == want["dtype"]
            assert list(array.shape) == want["shape"]
            assert hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest() \
                == want["sha256"], (step, name)
    assert series.verify() == []


@pytest.mark.parametrize("negative", ["version1", "mixed_base"])
def test_the_negative_series_manifests_are_refused(series_dir, negative):
    shutil.copy(VECTORS / f"{negative}.manifest.json", series_dir / "manifest.json")
    with pytest.raises(CorruptError):
        Series(series_dir)
