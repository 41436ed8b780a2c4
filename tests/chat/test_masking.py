import numpy as np

from sftdata.chat.markers import MarkerIds
from sftdata.chat.masking import loss_mask, rule_mask

# the markers of a dataset written before reasoning and untrained turns had markers ...
M = MarkerIds(system=1001, user=1002, assistant=1003, tool=1004, tool_call=1005, end=1006, eos=1000)
S, U, A, T, C, E, EOS = M.system, M.user, M.assistant, M.tool, M.tool_call, M.end, M.eos
# ... and all of them: K/k = THINK/END_THINK, X = ASSISTANT_CONTEXT
M9 = MarkerIds(system=1001, user=1002, assistant=1003, tool=1004, tool_call=1005, end=1006, eos=1000,
               think=1007, end_think=1008, assistant_context=1009)
K, k, X = M9.think, M9.end_think, M9.assistant_context


def mask_of(ids, m=M):
    return loss_mask(np.array(ids, dtype=np.uint32), m).tolist()


def test_assistant_span_trained_with_markers():
    ids = [S, 7, E, U, 8, 9, E, A, 10, 11, E, EOS]
    assert mask_of(ids) == [0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0]


def test_two_turns_both_trained():
    ids = [U, 5, E, A, 6, E, U, 7, E, A, 8, 9, E, EOS]
    assert mask_of(ids) == [0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 0]


def test_leading_assistant_has_no_context_and_stays_untrained():
    ids = [A, 5, E, U, 6, E, A, 7, E, EOS]
    assert mask_of(ids) == [0, 0, 0, 0, 0, 0, 1, 1, 1, 0]


def test_row_starting_inside_a_user_span_trains_nothing_after_it():
    ids = [6, 6, E, A, 7, E]
    assert mask_of(ids) == [0] * 6


def test_incomplete_user_span_blocks_the_assistant():
    # <|USER|> without its <|END|> before the assistant opener
    ids = [U, 5, A, 6, E]
    assert mask_of(ids) == [0] * 5


def test_unclosed_assistant_zeroes_itself_and_everything_after():
    ids = [U, 5, E, A, 6, 7]
    assert mask_of(ids) == [0] * 6
    ids = [U, 5, E, A, 6, E, U, 7, E, A, 8, U, 9, E, A, 1, E]
    assert mask_of(ids) == [0, 0, 0, 1, 1, 1] + [0] * 11


def test_tool_result_is_context_for_the_next_assistant():
    ids = [U, 5, E, A, C, 6, E, T, 7, E, A, 8, E, EOS]
    assert mask_of(ids) == [0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 0]


def test_incomplete_tool_span_blocks_the_following_assistant():
    ids = [U, 5, E, A, C, 6, E, T, 7, A, 8, E]
    assert mask_of(ids) == [0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0]


def test_eos_resets_the_conversation():
    # the user span belongs to the previous conversation: the assistant after EOS has no context
    ids = [U, 5, E, EOS, A, 6, E, EOS]
    assert mask_of(ids) == [0] * 8


def test_packed_conversations_each_trained():
    ids = [U, 5, E, A, 6, E, EOS, S, 1, E, U, 7, E, A, 8, E, EOS]
    assert mask_of(ids) == [0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0]


def test_system_span_is_not_context():
    ids = [S, 5, E, A, 6, E, EOS]
    assert mask_of(ids) == [0] * 7


def test_no_markers_and_empty():
    assert mask_of([5, 6, 7]) == [0, 0, 0]
    assert mask_of([]) == []


def test_input_is_not_modified_and_dtype_is_uint8():
    ids = np.array([U, 5, E, A, 6, E], dtype=np.uint32)
    before = ids.copy()
    out = loss_mask(ids, M)
    assert out.dtype == np.uint8
    assert np.array_equal(ids, before)


def test_matches_a_per_token_reference_on_random_sequences():
    rng = np.random.default_rng(0)
    alphabet = np.array([S, U, A, T, C, E, EOS, 5, 6, 7, 8, 9])
    for _ in range(300):
        ids = rng.choice(alphabet, size=rng.integers(0, 40))
        assert mask_of(ids) == reference(ids.tolist())


def test_reasoning_is_trained_with_its_reply():
    ids = [U, 5, E, A, K, 6, 7, k, 8, E, EOS]
    assert mask_of(ids, M9) == [0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 0]


def test_a_context_assistant_turn_is_never_trained_and_the_next_one_is():
    ids = [U, 5, E, X, 6, E, U, 7, E, A, 8, E, EOS]
    assert mask_of(ids, M9) == [0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0]
    # with its reasoning, and with no user turn between it and the trained turn
    ids = [U, 5, E, X, K, 6, k, 6, E, A, K, 7, k, 8, E, EOS]
    assert mask_of(ids, M9) == [0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 0]


def test_a_context_turn_is_no_context_for_the_assistant_after_it():
    # a row that starts inside the untrained turn: the trained turn has no complete user span
    ids = [6, E, X, 6, E, A, 7, E]
    assert mask_of(ids, M9) == [0] * 8


def test_an_unclosed_context_turn_trains_nothing_and_stops_nothing():
    assert mask_of([U, 5, E, X, 6, EOS, U, 7, E, A, 8, E], M9) == [0] * 9 + [1, 1, 1]
    assert rule_mask(np.array([U, 5, E, X, 6], dtype=np.uint32), M9)[1] == -1
    # an assistant closed by no END before a context opener is unclosed
    ids = [U, 5, E, A, 6, X, 7, E, U, 8, E, A, 9, E]
    assert mask_of(ids, M9) == [0] * 14 and rule_mask(np.array(ids), M9)[1] == 3


def test_without_the_added_markers_their_ids_are_ordinary_tokens():
    """A dataset with six markers: ids past them (never written there) change nothing."""
    ids = [U, 5, E, X, 6, E, A, K, 7, k, E, EOS]
    assert mask_of(ids, M) == [0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 0]  # X, K, k: plain tokens here
    assert mask_of([U, 5, E, A, 6, E, EOS], M) == mask_of([U, 5, E, A, 6, E, EOS], M9)


def test_all_markers_match_the_reference_on_random_sequences():
    rng = np.random.default_rng(2)
    alphabet = np.array([S, U, A, T, C, E, EOS, K, k, X, 5, 6])
    for _ in range(500):
        ids = rng.choice(alphabet, size=rng.integers(0, 40)).tolist()
        mask, stop = rule_mask(np.array(ids, dtype=np.uint32), M9)
        assert mask.tolist() == reference(ids, M9) and stop == reference_stop(ids, M9)
        assert mask_of(ids, M) == reference(ids, M)


def test_rule_mask_says_where_an_unclosed_assistant_stops_the_rule():
    assert rule_mask(np.array([U, 5, E, A, 6, E, U, 7, E, A, 8, EOS, U, 9, E, A, 1, E]), M)[1] == 9
    assert rule_mask(np.array([U, 5, E, A, 6, E, EOS]), M)[1] == -1
    rng = np.random.default_rng(1)
    alphabet = np.array([S, U, A, T, C, E, EOS, 5, 6])
    for _ in range(300):
        ids = rng.choice(alphabet, size=rng.integers(0, 30)).tolist()
        mask, stop = rule_mask(np.array(ids, dtype=np.uint32), M)
        assert mask.tolist() == reference(ids) and stop == reference_stop(ids)


def openers_of(m):
    return {m.system, m.user, m.assistant, m.tool} | ({m.assistant_context} if m.assistant_context else set())


def reference_stop(ids, m=M):
    """Position of the first <|ASSISTANT|> whose next span marker (or EOS) is not <|END|>."""
    for i, t in enumerate(ids):
        if t == A:
            nxt = [x for x in ids[i + 1:] if x in openers_of(m) | {E, EOS}]
            if not nxt or nxt[0] != E:
                return i
    return -1


def reference(ids, m=M):
    """Direct reading of the rule, one token at a time (slow, obviously right). An
    ASSISTANT_CONTEXT span (when ``m`` has it) is skipped like a system span."""
    out = [0] * len(ids)
    openers = openers_of(m)
    ctx_complete = False  # latest USER/TOOL span since EOS is complete
    i = 0
    while i < len(ids):
        t = ids[i]
        if t == EOS:
            ctx_complete = False
        elif t in openers:
            j = i + 1
            while j < len(ids) and ids[j] not in openers | {E, EOS}:
                j += 1
            closed = j < len(ids) and ids[j] == E
            if t == A:
                if not closed:
                    return out  # it and everything after stay 0
                if ctx_complete:
                    for k in range(i, j + 1):
                        out[k] = 1
            elif t in (U, T):
                ctx_complete = closed
            if closed:
                i = j
        i += 1
    return out
