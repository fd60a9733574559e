import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")


def pytest_collection_modifyitems(items):
    """The Triton interpreter's own NumPy deprecation noise (it indexes with 1-element arrays)."""
    for item in items:
        if "tests/torch/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.filterwarnings("ignore::DeprecationWarning:triton"))
