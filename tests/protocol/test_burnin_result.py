"""A step's result line is written by the node under test: whatever it prints, the head reads a result or
a clear refusal (BadResult), never an exception of another kind nor a value the database cannot store."""

from __future__ import annotations

import pytest

from gpufleet.protocol.burnin import RESULT_MARK, BadResult, StepResult, format_result, parse_result


def test_the_last_result_line_is_read() -> None:
    first = format_result(StepResult(kind="gemm", value=1.0, unit="TFLOPS"))
    last = format_result(StepResult(kind="gemm", value=2.0, unit="TFLOPS", per_gpu={"0": 2.0}))
    assert parse_result("noise\n" + first + "more\n" + last).value == 2.0


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("", "printed no result"),
        (RESULT_MARK + "{", "cannot be read"),
        (RESULT_MARK + '{"kind":"gemm","value":NaN,"unit":"x"}', "NaN is not a number"),
        (RESULT_MARK + '{"kind":"gemm","value":1,"unit":"x","evidence":{"a":1e999}}', "not a finite number"),
        (RESULT_MARK + '{"kind":"gemm","value":1,"unit":"x\\u0000"}', "NUL character"),
        (
            RESULT_MARK + '{"kind":"gemm","value":1,"unit":"x","evidence":{"a":' + "[" * 30000 + "]" * 30000 + "}}",
            "too deep",
        ),
        (RESULT_MARK + '{"kind":"gemm","value":1,"unit":"x","extra":1}', "cannot be read"),
        (RESULT_MARK + '{"kind":"gemm","value":1,"unit":"x","per_gpu":{"0":1e400}}', "not a finite number"),
        (RESULT_MARK + '{"kind":"gemm","value":1,"unit":"' + "x" * 70000 + '"}', "over 65536 characters"),
    ],
)
def test_a_bad_line_is_refused_with_why(line: str, why: str) -> None:
    with pytest.raises(BadResult, match=why):
        parse_result(line)
