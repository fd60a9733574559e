"""The serving API's text side without a model: request checks name the field; the detokeniser
hands out text as it becomes final, cuts stop strings (held back until they cannot start), and
keeps a multi-byte character split across tokens until it is whole."""

import pytest

from flashspec.serving import BadRequest, Detokenizer, check_params


class BytesTokenizer:
    """One token per UTF-8 byte (id = byte value); an incomplete character decodes to U+FFFD."""

    def decode(self, ids, skip_special_tokens=True, clean_up_tokenization_spaces=False) -> str:
        return bytes(ids).decode("utf-8", errors="replace")


def feed_all(detok, text: str, group: int = 1):
    data = list(text.encode())
    out, stopped = [], False
    for i in range(0, len(data), group):
        last = i + group >= len(data)
        piece, stopped = detok.feed(data[i : i + group], final=last)
        out.append(piece)
        if stopped:
            break
    return out, stopped


def test_text_comes_out_whole():
    out, stopped = feed_all(Detokenizer(BytesTokenizer(), ()), "héllo wörld")
    assert "".join(out) == "héllo wörld" and not stopped
    assert all("\ufffd" not in piece for piece in out)


@pytest.mark.parametrize("group", [1, 3, 7])
def test_a_stop_string_is_cut_and_never_sent(group):
    out, stopped = feed_all(Detokenizer(BytesTokenizer(), ("STOP", "xyz")), "abc STOP def", group)
    assert stopped and "".join(out) == "abc "
    assert not any("S" in piece for piece in out)


def test_the_earliest_stop_string_wins_and_partial_matches_are_released():
    out, stopped = feed_all(Detokenizer(BytesTokenizer(), ("bar", "ST")), "a S b STbar")
    assert stopped and "".join(out) == "a S b "
    out, stopped = feed_all(Detokenizer(BytesTokenizer(), ("STOP",)), "a STO")
    assert not stopped and "".join(out) == "a STO"  # at the end, the held-back text is sent


@pytest.mark.parametrize("args,param", [
    ((0, 1.0, 1.0, 0, 0, None), "max_tokens"),
    ((4, -1.0, 1.0, 0, 0, None), "temperature"),
    ((4, 1.0, 0.0, 0, 0, None), "top_p"),
    ((4, 1.0, 1.0, -2, 0, None), "top_k"),
    ((4, 1.0, 1.0, 1.5, 0, None), "top_k"),
    ((4, 1.0, 1.0, 0, -1, None), "seed"),
    ((4, 1.0, 1.0, 0, 0, ["a", ""]), "stop"),
    ((4, 1.0, 1.0, 0, 0, ["a"] * 5), "stop"),
    ((4, "hot", 1.0, 0, 0, None), "temperature"),
])
def test_bad_settings_name_their_field(args, param):
    with pytest.raises(BadRequest) as e:
        check_params(*args)
    assert e.value.param == param and param in str(e.value)


def test_good_settings_pass():
    p = check_params(8, 0.7, 0.9, 20, 3, "\n\n")
    assert (p.max_tokens, p.sampling.temperature, p.sampling.top_k, p.seed, p.stop) == (8, 0.7, 20, 3, ("\n\n",))
