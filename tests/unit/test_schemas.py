"""Request schemas: what each body becomes, and what each refuses."""

from __future__ import annotations

import pytest

from blitz.errors import InvalidValue
from blitz.http.bodies import OpenAIEmbeddingRequest


@pytest.mark.parametrize(("value", "texts", "token_ids"), [
    ("a", ["a"], None),
    (["a", "b"], ["a", "b"], None),
    ([1, 2, 3], None, [[1, 2, 3]]),
    ([[1, 2], [3]], None, [[1, 2], [3]]),
    ([], [], None),
])
def test_openai_input_becomes_texts_or_token_ids(value, texts, token_ids):
    req = OpenAIEmbeddingRequest.parse({"input": value, "model": "m"})
    assert req.texts_or_token_ids() == (texts, token_ids)


@pytest.mark.parametrize("value", [["a", 1], [1, "a"], [[1], 2], [[1, "a"]], [True], [1.5],
                                   [None]])
def test_openai_input_of_mixed_items_is_refused(value):
    with pytest.raises(InvalidValue) as info:
        OpenAIEmbeddingRequest.parse({"input": value})
    assert info.value.param == "input"
