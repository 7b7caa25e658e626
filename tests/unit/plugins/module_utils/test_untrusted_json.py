# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import pytest
from ansible_collections.vllm_ops.dflash.plugins.module_utils._untrusted_json import MAX_DEPTH, TooDeep, loads


def test_nesting_up_to_the_cap_parses_and_one_more_is_refused():
    assert loads("[" * MAX_DEPTH + "]" * MAX_DEPTH) is not None
    with pytest.raises(TooDeep, match=f"nested deeper than {MAX_DEPTH} levels"):
        loads("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1))


def test_brackets_inside_strings_do_not_count():
    text = '{"a": "' + "[{" * 1000 + '\\"[[["}'
    assert loads(text) == {"a": "[{" * 1000 + '"[[['}


def test_a_refusal_is_a_value_error_that_does_not_quote_the_document():
    with pytest.raises(ValueError) as error:
        loads('{"secret": ' + "[" * 100_000)
    assert "secret" not in str(error.value)
