"""The map (README.md's "Layout", docs/architecture.md's tables) is the one the package and
module docstrings make, and every package's docstring names each of its modules."""

from __future__ import annotations

from blitz import map as house_map


def test_the_map_in_the_documents_is_generated_from_the_docstrings():
    stale = [str(path.relative_to(house_map.ROOT)) for path, text in house_map.rendered().items()
             if text != path.read_text(encoding="utf-8")]
    assert stale == [], f"the map in {stale} differs from the docstrings: " \
        f"run `{house_map.COMMAND}` and commit them"


def test_every_package_docstring_names_each_of_its_modules():
    assert house_map.unnamed_modules() == {}, "package docstrings (blitz/<package>/" \
        "__init__.py) that do not name these modules as ``name``: say what each holds"


def test_every_module_says_what_it_is():
    assert house_map.undocumented() == []


def test_a_floor_is_one_above_the_highest_unit_imported():
    floors = house_map.floors()
    assert floors["blitz.errors"] == 0
    assert floors["blitz.http"] > floors["blitz.ingress"] > floors["blitz.pool"]
    assert floors["blitz.settings"] > floors["blitz.runtime"]


def test_headlines_and_first_sentences():
    assert house_map.headline("Encoders: one contract (``base.Encoder``) and one backend.") \
        == "Encoders"
    assert house_map.headline("``cpu_backend: auto``: the fastest backend.") \
        == "``cpu_backend: auto``"
    assert house_map.first_sentence("One error hierarchy, one status table.\n\nMore.") \
        == "One error hierarchy, one status table"
    assert house_map.first_sentence("Text to ids, e.g. the\nbi-encoders'. Then more.") \
        == "Text to ids, e.g. the bi-encoders'"


def test_the_markers_are_required():
    import pytest

    with pytest.raises(ValueError, match="markers"):
        house_map.updated("no markers here", "layout", "| table |")
