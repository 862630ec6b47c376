"""The bookkeeping behind `cudagraphs=True` (backends/cudagraphs.py), on CPU tensors: which holders of a
storage the replay rules see, and when a replay is refused. Captures themselves need a GPU
(tests/test_triton.py runs them with PASSLINE_TEST_DEVICE=cuda); the rules are plain reference counting and
run anywhere."""
import gc

import torch

from passline.backends import cudagraphs as cg
from passline.backends.triton import compat


class _Arena:  # an Arena without a CUDA graph pool: the rules only read its slots
    def __init__(self):
        self.slots = []
        self.members = 0


def _slots(pool, n, seq, keep):
    """n slots of capture `seq`, each over a fresh storage whose capture tensor `keep` holds."""
    out = []
    for _ in range(n):
        t = torch.zeros(64)
        keep.append(t)  # alive until the caller drops it: distinct addresses
        s = cg.Slot(seq, t.untyped_storage())
        s.base(torch.float32)
        pool.owned.setdefault(s.ptr, []).append(s)
        pool.by_storage[s.cdata] = s
        out.append(s)
    return out


def _replay_output(slot):
    """What a replay hands out: a tensor over the slot that owns none of its memory."""
    return compat.alias(slot.base(torch.float32), (8, 8), (8, 1), 0)


def _graph(pool, arena, seq, slots, groups=(), reused=()):
    g = cg.CudaGraphed.__new__(cg.CudaGraphed)
    g.pool, g.arena, g.seq, g.slots = pool, arena, seq, list(slots)
    g.groups, g.reused = list(groups), list(reused)
    arena.slots.extend(slots)
    return g


def test_a_slot_is_live_while_the_capture_tensor_or_a_replay_output_is():
    pool, keep = cg.Pool(), []
    (slot,) = _slots(pool, 1, 0, keep)
    assert slot.fresh_live() and slot.live() and not slot.held()
    keep.clear()
    gc.collect()
    assert not slot.live()  # the capture's own tensor died: the allocator may reuse the memory
    out = _replay_output(slot)
    assert slot.held() and slot.live()
    view = out[2:]
    del out
    assert slot.held()  # a view of a replay output holds the storage too
    del view
    assert not slot.held()


def test_alone_sees_every_holder_but_the_list():
    pool, keep = cg.Pool(), []
    slots = _slots(pool, 2, 0, keep)
    keep.clear()
    g = _graph(pool, _Arena(), 1, [])
    args = [_replay_output(slots[0]), torch.ones(3), _replay_output(slots[1])]
    assert g._alone(args, (0,)) is slots[0]
    assert g._alone(args, (1,)) is None  # held by the list alone, not a slot
    held = args[1]
    assert g._alone(args, (1,)) is False  # a name holds it
    del held
    x = args[0]
    assert g._alone(args, (0,)) is False
    del x
    v = args[0][1:]  # a view shares the storage
    assert g._alone(args, (0,)) is False
    del v
    st = args[0].untyped_storage()  # the storage object alone, without a tensor
    assert g._alone(args, (0,)) is False and slots[0].held()
    del st
    args.append(args[0])  # the same tensor twice in the list
    assert g._alone(args, (0, 3)) is slots[0]
    args.append(_replay_output(slots[0]))  # another tensor over the storage, in the list too
    assert g._alone(args, (0, 3, 4)) is slots[0]
    assert g._alone(args, (0, 3)) is False  # ... which the group must name
    args.clear()
    assert not slots[0].held()


def test_replays_wait_for_what_they_would_overwrite():
    # F captured first (seq 0), B after it (seq 1); B's capture reused F's first slot (free at its end) and
    # reads F's second slot as an input the call's list alone held
    pool, keep = cg.Pool(), []
    arena = _Arena()
    f_slots = _slots(pool, 2, 0, keep)
    b_slots = _slots(pool, 1, 1, keep)
    keep.clear()
    gc.collect()
    forward = _graph(pool, arena, 0, f_slots)
    backward = _graph(pool, arena, 1, b_slots, groups=[(0,)], reused=[f_slots[0], f_slots[1]])

    assert forward._blocked([]) is None
    grad = _replay_output(b_slots[0])  # a .grad from B's last replay
    assert "after it" in forward._blocked([])  # F's buffers may lie where B's output is
    del grad
    out = _replay_output(f_slots[0])
    assert "previous outputs" in forward._blocked([])
    # B: its input (F's second slot) held by the list alone; F's first slot, reused by B's capture, held
    args = [_replay_output(f_slots[1])]
    assert "reused" in backward._blocked(args)
    del out
    assert backward._blocked(args) is None
    kept = args[0]  # the caller keeps the input B's capture could free or overwrite
    assert "held elsewhere" in backward._blocked(args)
    del kept
    assert backward._blocked(args) is None
    args.clear()


def test_a_capture_goes_to_a_new_pool_while_a_replay_output_is_held(monkeypatch):
    made = []

    class Arena(_Arena):
        def __init__(self):
            super().__init__()
            made.append(self)

        clean = cg.Arena.clean

    monkeypatch.setattr(cg, "Arena", Arena)
    pool, keep = cg.Pool(), []
    first = pool.for_capture()
    assert pool.for_capture() is first
    first.slots.extend(_slots(pool, 1, 0, keep))
    keep.clear()
    assert pool.for_capture() is first  # the capture's own tensor is the allocator's: it protects it
    out = _replay_output(first.slots[0])
    second = pool.for_capture()
    assert second is not first and len(made) == 2  # the allocator cannot see `out`
    assert pool.for_capture() is second and pool.arenas == [first, second]  # `out` still needs `first`'s memory
    del out
    assert pool.for_capture() is second and pool.arenas == [second]  # no graph there, nothing over its slots


def test_a_replay_builds_its_outputs_as_the_rules_say():
    # the written-out builder returns, for each kind: a tensor over a slot, an input as it is or a view of it,
    # a copy of the held small output, a value
    base = torch.arange(20.0)
    outputs = [("base", (base, (2, 3), (3, 1), 2)), ("input", (1, None)), ("input", (0, ((2,), (1,), 1))),
               ("copy", torch.ones(2)), ("value", 7), ("copy", torch.arange(6.0).view(2, 3).t())]
    args = [torch.arange(5.0), torch.zeros(4)]
    built = cg._builder(outputs)(args)
    expected = [base.as_strided((2, 3), (3, 1), 2), args[1], args[0].as_strided((2,), (1,), 1), outputs[3][1], 7,
                outputs[5][1]]  # the copies are made together (one launch), the transposed one keeps its strides
    for (kind, _), a, b in zip(outputs, built, expected):
        if kind == "value":
            assert a == b
            continue
        assert a.shape == b.shape and a.stride() == b.stride() and torch.equal(a, b)
        same_memory = a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
        assert same_memory == (kind != "copy"), kind  # over the slot or the input; a copy is new memory
    assert built[1] is args[1] and torch.equal(built[0], base[2:8].view(2, 3))
    assert built[0]._base is None  # not an autograd view: AccumulateGrad may take it over


class _Graph:  # a captured graph that records its replays
    def __init__(self):
        self.replays = 0

    def replay(self):
        self.replays += 1


def _captured(pool, args, static):
    """A CudaGraphed as its capture leaves it, reading `static` of `args` in place, copying nothing."""
    g = cg.CudaGraphed.__new__(cg.CudaGraphed)
    g.pool, g.arena, g.seq, g.slots, g.groups, g.reused = pool, _Arena(), 0, [], [], []
    g.cuda_graph, g.captures, g.replays, g.uncaptured, g.why = _Graph(), 1, 0, 0, ""
    g.static, g.static_ptrs, g.pooled = static, [args[k].data_ptr() for k in static], set()
    g.statics, g.copied_back, g.unstable, g.outputs, g.last_ptrs = {}, [], set(), [], None
    g.build = cg._builder([("input", (static[0], None))])
    g.report = type("Report", (), {"cudagraphs": ""})()
    g.captured = []
    g._run = lambda a: ["uncaptured"]
    g._capture = lambda a, ptrs, last: g.captured.append((ptrs, last)) or ["captured"]
    return g


def test_calls_replay_while_inputs_stay_put_and_capture_again_when_one_moves():
    pool = cg.Pool()
    weight, x = torch.ones(4), torch.zeros(4)
    g = _captured(pool, [weight, x], static=[0])
    out = g.boxed([weight, torch.zeros(4)])  # x is copied, not looked at: any address
    assert out[0] is weight and g.cuda_graph.replays == 1
    moved = torch.ones(4)
    assert g.boxed([moved, x]) == ["captured"]
    (ptrs, last), = g.captured
    assert ptrs == [moved.data_ptr(), x.data_ptr()] and last == [weight.data_ptr(), None]
    assert g.unstable == {0}  # copied from the next capture on: it did not move into a captured output
    # an input that another captured graph gave, now from its uncaptured call: this call runs uncaptured
    g = _captured(pool, [weight, x], static=[0])
    g.pooled = {0}
    assert g.boxed([torch.ones(4), x]) == ["uncaptured"] and g.uncaptured == 1 and not g.captured


def test_outputs_are_inputs_only_by_their_storage_not_their_address():
    # a capture frees an input at its last use and may allocate an output right where it began: that output
    # is the graph's own (a slot the rules watch), not the input returned again
    from torch.multiprocessing.reductions import StorageWeakRef

    g = cg.CudaGraphed.__new__(cg.CudaGraphed)
    g.seq, g.saved_from = 0, None
    out = torch.ones(512)  # 2 KiB: above the small outputs copied per call
    dead = torch.zeros(512)
    gone = StorageWeakRef(dead.untyped_storage())
    del dead
    assert gone.expired()
    inputs = {out.untyped_storage().data_ptr(): (0, (512,), (1,), 0, torch.float32, gone)}
    how, slots = g._classify([out], inputs)
    assert how[0][0] == "base" and len(slots) == 1
    # the input's own storage, alive: returned as the input; as another dtype: over the call's input
    x = torch.arange(512.0)
    given = cg._views([x])
    how, slots = g._classify([x, x[2:], x.view(torch.int32)], given)
    assert [h[0] for h in how] == ["input", "input", "input_as"] and not slots
    args = [torch.arange(512.0) + 1]
    built = cg._builder(how)(args)
    assert built[0] is args[0] and torch.equal(built[1], args[0][2:])
    assert built[2].dtype == torch.int32 and torch.equal(built[2], args[0].view(torch.int32))
    # storages of no bytes all lie at address 0: never inputs, slots or groups; returned as copies
    how, slots = g._classify([torch.empty(0), torch.empty(0, 3)], cg._views([torch.empty(0)]))
    assert [h[0] for h in how] == ["copy", "copy"] and not slots


def test_inputs_that_keep_moving_stop_the_captures():
    pool = cg.Pool()
    weight, x = torch.ones(4), torch.zeros(4)
    g = _captured(pool, [weight, x], static=[0])
    g.captures = cg.MAX_CAPTURES
    assert g.boxed([torch.ones(4), x]) == ["uncaptured"] and not g.captured
    assert g.captures > cg.MAX_CAPTURES and g.report.cudagraphs.startswith("off")
    assert g.boxed([weight, x]) == ["uncaptured"]  # for good, even where the input came back


def test_static_copies_of_expanded_inputs_and_dtype_views_of_copied_inputs():
    # an input whose elements overlap (an expanded mask) is copied by the memory it spans
    mask = torch.arange(6.0).view(1, 6).expand(4, 6)
    buf = cg._Static(mask)
    assert buf.tensor.stride() == mask.stride() and torch.equal(buf.tensor, mask)
    other = torch.arange(6.0, 12.0).view(1, 6).expand(4, 6)
    buf.fill(other)
    assert torch.equal(buf.tensor, other)
    # an output viewing an input as another dtype, rebuilt over the caller's input at its own offset
    g = cg.CudaGraphed.__new__(cg.CudaGraphed)
    g.seq, g.saved_from = 0, None
    copy = torch.arange(512.0)  # the static copy the capture read
    out = copy[4:].view(torch.int32)
    how, _ = g._classify([out], cg._views([copy]))
    assert how[0][0] == "input_as"
    caller = torch.arange(1000.0)[100:612]  # the caller's input: another storage, another offset
    rebuilt = cg._builder(how)([caller])[0]
    assert torch.equal(rebuilt, caller[4:].view(torch.int32))
    assert torch.equal(g._first(out, how[0], {0: caller}), caller[4:].view(torch.int32))


def test_a_graph_whose_inputs_come_from_a_later_capture_is_captured_again():
    # F (seq 2) was captured again after B (seq 1), into the same pool, and put its outputs where B's
    # inputs were: B may lie in F's new buffers, so B's replay is refused — and B is captured again, not
    # left uncaptured for good
    pool, keep = cg.Pool(), []
    arena = _Arena()
    b_slots = _slots(pool, 1, 1, keep)
    f_slots = _slots(pool, 1, 2, keep)
    keep.clear()
    gc.collect()
    args = [_replay_output(f_slots[0])]
    g = _captured(pool, args, static=[0])
    g.arena, g.seq, g.slots, g.groups = arena, 1, b_slots, [(0,)]
    arena.slots.extend(b_slots + f_slots)
    assert g._blocked(args) is cg._STALE
    assert g.boxed(args) == ["captured"] and g.uncaptured == 0
    held = _replay_output(f_slots[0])  # held elsewhere too: refused, not captured again
    args = [_replay_output(f_slots[0])]
    why = g._blocked(args)
    assert why is not cg._STALE and "held elsewhere" in why
    del held


def test_a_retired_graph_leaves_its_pool_and_its_addresses():
    pool, keep = cg.Pool(), []
    arena = _Arena()
    first = _slots(pool, 1, 0, keep)
    g = _graph(pool, arena, 0, first)
    arena.members = 1
    g.cuda_graph, g.statics = _Graph(), {}
    other = cg.Slot(1, keep[0].untyped_storage())  # another graph's current slot at the same address
    pool.owned[other.ptr].append(other)
    g._retire()
    assert arena.members == 0 and g.arena is None and g.cuda_graph is None
    assert pool.owned[other.ptr] == [other] and first[0].cdata not in pool.by_storage and first[0].retired


def test_a_dropped_backend_keeps_its_pool_while_a_replay_output_is_held(monkeypatch):
    # a .grad from the last replay outlives the compiled model: the pool's graphs (and so its memory) are
    # kept until nothing is over its slots, then let go at the next capture anywhere
    monkeypatch.setattr(cg, "_KEPT", [])

    class Arena(_Arena):
        clean = cg.Arena.clean

    monkeypatch.setattr(cg, "Arena", Arena)
    pool, keep = cg.Pool(), []
    arena = pool.for_capture()
    arena.slots.extend(_slots(pool, 1, 0, keep))
    keep.clear()
    grad = _replay_output(arena.slots[0])
    del pool
    gc.collect()
    assert cg._KEPT == [arena]
    del grad
    cg.Pool().for_capture()
    assert cg._KEPT == []
