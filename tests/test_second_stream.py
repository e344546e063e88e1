"""scripts/bench/second_stream.py on CPU: its plan, and the step paused around every action."""

import contextlib
import ctypes
import types

import pytest

from scripts.bench import second_stream, step_thread
from scripts.render import benchmarks as render_benchmarks


def test_the_plan_reads_each_action_and_refuses_what_is_none():
    assert second_stream.parse_plan(
        ["alone", "k1", "k1000", "destroy", "x4", "p5", "h3", "g2", "c3", "destroy", "j6"]) == [
        ("alone", 0), ("k", 1), ("k", 1000), ("destroy", 0), ("x", 4), ("p", 5), ("h", 3),
        ("g", 2), ("c", 3), ("destroy", 0), ("j", 6)]
    assert second_stream.parse_plan(["q64", "destroy"]) == [("q", 64), ("destroy", 0)]
    assert second_stream.parse_plan(["n10", "m64"]) == [("n", 10), ("m", 64)]
    assert second_stream.parse_plan(["y3", "destroy", "r1", "destroy"])[-1] == ("destroy", 0)
    for bad in ("k0", "k", "z3", "x0", "y0", "r", "q0", "n0", "m0", "kk", "p-1", "h0", "Alone",
                "g0", "c", "j-2"):
        with pytest.raises(ValueError, match=repr(bad)):
            second_stream.parse_plan(["alone", bad])
    for bad in (["alone", "destroy"], ["destroy", "k1"], ["k1", "destroy", "destroy"],
                ["x1", "destroy"], ["j1", "destroy"]):  # XLA's streams are XLA's to destroy
        with pytest.raises(ValueError, match="no second stream to destroy"):
            second_stream.parse_plan(bad)
    assert second_stream.parse_plan(["k1", "destroy", "k2", "destroy"])[-1] == ("destroy", 0)


def test_a_bad_plan_or_no_out_stops_before_any_training(capsys):
    for argv in (["--plan", "alone", "k0", "--out=x.json"], ["--plan", "alone"]):
        with pytest.raises(SystemExit) as stopped:
            second_stream.main(argv)
        assert stopped.value.code == 2
    assert ("'k0' is not alone, destroy, kN, xN, gN, cN, jN, rN, yN, qN, nN, mN, pN or hN"
            in capsys.readouterr().err)


class _FakeKernels:
    """Records each launch and whether the step was paused, none in flight, then."""

    made: list["_FakeKernels"] = []

    def __init__(self, ordinal, priority="least", sync_domain="default", existing=None):
        self.ordinal, self.launches, self.destroyed = ordinal, [], False
        self.stream_options, self.existing = (priority, sync_domain), existing
        self.stream = object()  # a stream of its own
        _FakeKernels.made.append(self)

    @classmethod
    def on(cls, stream):  # on a stream made elsewhere (a green context's)
        kernels = cls(stream.ordinal, existing=stream)
        kernels.stream = stream
        return kernels

    def launch(self, count):
        self.launches.append((count, _paused()))

    def launch_graph(self, count):
        self.launches.append(("graph", count, _paused()))

    def launch_clustered(self, count):
        self.launches.append(("clustered", count, _paused()))

    def destroy(self):
        self.destroyed = _paused()


class _FakeDecodes:
    """Records each decode, its format, the stream it was given and whether the step was
    paused, none in flight, then."""

    made: list["_FakeDecodes"] = []

    def __init__(self, ordinal, stream):
        self.ordinal, self.stream, self.decodes = ordinal, stream, []
        _FakeDecodes.made.append(self)

    def decode(self, count, sample_format):
        self.decodes.append((count, sample_format, _paused()))

    def decode_captured(self, count):
        self.decodes.append(("captured", count, _paused()))
        return {"capture_error": None, "decoded_mean": 100.0, "pillow_mean": 100.5}


class _FakeGreen:
    """A green context's stream: the SMs asked for, and those CUDA gave."""

    made: list["_FakeGreen"] = []

    def __init__(self, ordinal, sms):
        self.ordinal, self.asked, self.sms = ordinal, sms, 24
        _FakeGreen.made.append(self)


_TIMES = []


def _paused():
    return not _TIMES[-1].running and _TIMES[-1].idle.is_set()


def test_each_action_runs_with_the_step_paused_then_a_row(tmp_path, monkeypatch):
    """Each action of the plan runs with the step paused and none in flight, in order, and a
    row follows it: the step's untraced rate over the row's seconds, the traced steps (no
    boundaries on CPU); a k after a destroy makes a new stream; x launches on XLA's stream,
    one object for every x, apart from k's."""
    training, others = step_thread.training, []

    @contextlib.contextmanager
    def kept(*args, **kwargs):
        with training(*args, **kwargs) as times:
            _TIMES.append(times)
            yield times

    monkeypatch.setattr(step_thread, "training", kept)
    monkeypatch.setattr(second_stream, "EmptyKernels", _FakeKernels)
    monkeypatch.setattr(second_stream, "xla_stream", lambda device: 4242)
    monkeypatch.setattr(second_stream, "other_process",
                        lambda ordinal, count: others.append((ordinal, count, _paused())))
    host, copies = second_stream.host_copies, []

    def copied(device, count):
        copies.append((count, _paused()))
        host(device, count)

    monkeypatch.setattr(second_stream, "host_copies", copied)
    programs, run_programs = [], second_stream.xla_programs

    def ran(device, count):  # the jitted program really runs, on the CPU here
        programs.append((count, _paused()))
        run_programs(device, count)

    monkeypatch.setattr(second_stream, "xla_programs", ran)
    monkeypatch.setattr(second_stream, "JpegDecodes", _FakeDecodes)
    monkeypatch.setattr(second_stream, "GreenStream", _FakeGreen)
    _FakeGreen.made.clear()
    _FakeKernels.made.clear()
    _FakeDecodes.made.clear()
    doc = second_stream.main(
        ["--per_gpu=4", "--tiny_model", "--train_model=alexnet_bn",
         "--train_compute_dtype=float32", "--seconds=0.5", "--trace_seconds=0.2",
         "--stream_priority=greatest", "--sync_domain=remote",
         "--plan", "alone", "k2", "x3", "y64", "k3", "x1", "p7", "destroy", "r5", "k1", "h2",
         "g4", "c5", "j6", "y2", "q3", "n2", "m4", "n5", "--green_sms=20",
         f"--out={tmp_path / 'o.json'}"])
    rows = doc["results"]
    assert [(r["action"], r["count"]) for r in rows] == [
        ("alone", 0), ("k", 2), ("x", 3), ("y", 64), ("k", 3), ("x", 1), ("p", 7), ("destroy", 0),
        ("r", 5), ("k", 1), ("h", 2), ("g", 4), ("c", 5), ("j", 6), ("y", 2), ("q", 3), ("n", 2),
        ("m", 4), ("n", 5)]
    first, xla, second, on_green = _FakeKernels.made
    assert first.launches == [(2, True), (3, True)] and first.destroyed is True
    assert xla.launches == [(3, True), (1, True)] and not xla.destroyed
    assert (first.existing, xla.existing, second.existing) == (None, 4242, None)
    # g and c launch on the second stream k made (after the destroy, the new one).
    assert second.launches == [(1, True), ("graph", 4, True), ("clustered", 5, True)]
    assert not second.destroyed
    assert first.stream_options == second.stream_options == ("greatest", "remote")
    # Decodes on the second stream of their time: one decoder per stream, remade after destroy.
    before, after, green_decodes = _FakeDecodes.made  # m's decoder on the green stream
    assert (before.stream, after.stream) == (first.stream, second.stream)
    assert green_decodes.stream is _FakeGreen.made[0]
    assert green_decodes.decodes == [(4, "I_RGB", True)]
    assert before.decodes == [(64, "P_YUV", True)]
    assert after.decodes == [(5, "I_RGB", True), (2, "P_YUV", True), ("captured", 3, True)]
    assert rows[-4]["decoded_mean"] == 100.0 and "decoded_mean" not in rows[-5]
    (green,) = _FakeGreen.made  # one green context for every n and m, its SMs in their rows
    assert (green.asked, on_green.stream) == (20, green)
    assert on_green.launches == [(2, True), (5, True)]
    assert [r.get("green_sms") for r in rows[-4:]] == [None, 24, 24, 24]
    assert others == [(0, 7, True)] and copies == [(2, True)] and programs == [(6, True)]
    for r in rows:
        assert r["seconds"] >= 0.5 and r["traced_steps"] >= 1 and r["boundaries"] is None, r
        assert r["timed_steps"] >= 2 and r["train_images_per_s"] > 0, r
    assert doc["environment"]["backend"] == "cpu"
    table = render_benchmarks.table(str(tmp_path / "o.json"))  # a row each, kernels added up
    assert [line.split(" | ")[2:4] for line in table.splitlines() if line.startswith("| - |")] == [
        ["alone", "0"], ["k2", "2"], ["x3", "5"], ["y64", "5"], ["k3", "8"], ["x1", "9"],
        ["p7", "9"], ["destroy", "9"], ["r5", "9"], ["k1", "10"], ["h2", "10"], ["g4", "14"],
        ["c5", "19"], ["j6", "19"], ["y2", "19"], ["q3", "19"], ["n2", "21"],
        ["m4", "21"], ["n5", "26"]]
    assert f"| {rows[1]['train_images_per_s']:,.0f} |" in table


def test_launch_only_launches_in_this_process_and_trains_nothing(monkeypatch):
    _FakeKernels.made.clear()
    _TIMES.append(step_thread.StepTimes())  # paused: nothing trains in this process
    _TIMES[-1].idle.set()
    monkeypatch.setattr(second_stream, "EmptyKernels", _FakeKernels)
    assert second_stream.main(["--launch_only=12", "--ordinal=1"]) is None
    (made,) = _FakeKernels.made
    assert made.ordinal == 1 and made.launches == [(12, True)]


class _FakeDriver:
    """libcuda's calls that CudaStream and EmptyKernels make, recorded; priorities 0 (least)
    to -5 (greatest) as an H200's driver reports them."""

    def __init__(self) -> None:
        self.created, self.attributes = [], []

    def __getattr__(self, name):  # the calls not recorded succeed
        recorded = getattr(type(self), f"_{name}", None)
        return (lambda *args: recorded(self, *args)) if recorded else (lambda *args: 0)

    def _cuCtxGetStreamPriorityRange(self, least, greatest):
        least._obj.value, greatest._obj.value = 0, -5
        return 0

    def _cuStreamCreateWithPriority(self, stream, flags, priority):
        stream._obj.value = 77
        self.created.append((flags, priority.value))
        return 0

    def _cuStreamSetAttribute(self, stream, attribute, value):
        domain = ctypes.c_int.from_buffer(value._obj).value
        self.attributes.append((stream.value, attribute, domain))
        return 0


@pytest.mark.parametrize("priority, domain, created, attribute", [
    ("least", "default", (1, 0), (77, 10, 0)), ("greatest", "remote", (1, -5), (77, 10, 1))])
def test_the_second_stream_is_made_as_asked(monkeypatch, priority, domain, created, attribute):
    # A non-blocking stream (flag 1) of the priority asked for, its kernels in the memory-sync
    # domain asked for (CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN = 10; default 0, remote 1).
    from jia_jax import cuda_stream

    driver = _FakeDriver()
    monkeypatch.setattr(cuda_stream.ctypes, "CDLL", lambda name: driver)
    kernels = second_stream.EmptyKernels(0, priority, domain)
    assert kernels.stream.handle == 77
    assert (driver.created, driver.attributes) == ([created], [attribute])
    with pytest.raises(ValueError, match="priority='high': least or greatest"):
        cuda_stream.CudaStream(0, "high")


def test_xla_stream_is_used_as_xla_made_it(monkeypatch):
    # An existing stream: none created, its attributes untouched, its handle the one given.
    from jia_jax import cuda_stream

    driver = _FakeDriver()
    monkeypatch.setattr(cuda_stream.ctypes, "CDLL", lambda name: driver)
    kernels = second_stream.EmptyKernels(0, existing=4242)
    assert kernels.stream.handle == 4242
    assert (driver.created, driver.attributes) == ([], [])


class _LaunchingDriver(_FakeDriver):
    """Also records, in order, the launch and graph calls EmptyKernels makes, which PTX it
    loads (module n is the n-th loaded; its kernel `empty` is 100 + n) and what each
    cuLaunchKernelEx is told."""

    _LOGGED = ("cuStreamBeginCapture_v2", "cuStreamEndCapture", "cuGraphInstantiateWithFlags",
               "cuGraphLaunch", "cuGraphExecDestroy", "cuGraphDestroy", "cuStreamSynchronize")

    def __init__(self) -> None:
        super().__init__()
        self.calls, self.loaded = [], []

    def __getattr__(self, name):
        base = super().__getattr__(name)

        def call(*args):
            if name in self._LOGGED:
                self.calls.append(name)
            return base(*args)
        return call

    def _cuModuleLoadData(self, module, ptx):
        self.loaded.append(ptx)
        module._obj.value = len(self.loaded)
        return 0

    def _cuModuleGetFunction(self, kernel, module, name):
        assert name == b"empty"
        kernel._obj.value = 100 + module.value
        return 0

    def _cuLaunchKernel(self, kernel, *args):
        self.calls.append(("launch", kernel.value))
        return 0

    def _cuLaunchKernelEx(self, config, kernel, params, extra):
        c = config._obj
        attributes = {c.attrs[i].id: bytes(c.attrs[i].value[:12]) for i in range(c.num_attrs)}
        self.calls.append(("launch_ex", kernel.value, tuple(c.grid), tuple(c.block), c.stream,
                           attributes))
        return 0


def test_a_graph_holds_the_kernels_and_is_launched_once(monkeypatch):
    from jia_jax import cuda_stream

    driver = _LaunchingDriver()
    monkeypatch.setattr(cuda_stream.ctypes, "CDLL", lambda name: driver)
    second_stream.EmptyKernels(0).launch_graph(3)
    assert driver.calls == [
        "cuStreamBeginCapture_v2", ("launch", 101), ("launch", 101), ("launch", 101),
        "cuStreamEndCapture", "cuGraphInstantiateWithFlags", "cuGraphLaunch",
        "cuStreamSynchronize", "cuGraphExecDestroy", "cuGraphDestroy"]


def test_clustered_launches_are_told_what_nccl_tells_its_own(monkeypatch):
    # A cluster of 4 blocks (CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4: x, y, z as uint32) in the
    # remote memory-sync domain (attribute 10, value 1), the kernel from PTX for sm_90, loaded
    # once, on the second stream (handle 77), waited for once.
    from jia_jax import cuda_stream

    driver = _LaunchingDriver()
    monkeypatch.setattr(cuda_stream.ctypes, "CDLL", lambda name: driver)
    kernels = second_stream.EmptyKernels(0)
    kernels.launch_clustered(2)
    kernels.launch_clustered(1)
    assert [b".target sm_50" in p for p in driver.loaded] == [True, False]
    assert b".target sm_90" in driver.loaded[1]
    told = {4: (4).to_bytes(4, "little") + (1).to_bytes(4, "little") * 2,
            10: (1).to_bytes(4, "little") + bytes(8)}
    launch = ("launch_ex", 102, (4, 1, 1), (1, 1, 1), 77, told)
    assert driver.calls == [launch, launch, "cuStreamSynchronize", launch, "cuStreamSynchronize"]


def test_jpeg_decodes_call_the_hardware_decoder_64_at_a_time_on_the_stream(monkeypatch):
    """On a fake nvImageCodec: calls of at most 64 code streams of one 500 x 375 4:2:0 JPEG, each
    on the stream given, its context current (as the decoder's making), and waited for; a
    refused JPEG raises, naming the format."""
    import io
    import sys

    import PIL.Image

    calls, waits, current = [], [], []

    @contextlib.contextmanager
    def made_current():
        current.append(True)
        yield
        current.pop()

    class Decoder:
        def __init__(self, device_id, backends):
            assert (device_id, backends, current) == (3, ["HW_GPU_ONLY"], [True])

        def decode(self, streams, params, cuda_stream):
            assert current == [True]
            calls.append((len(streams), params["sample_format"], params.get("color_spec"),
                          cuda_stream))
            return [None if params["sample_format"] == "NV12" else s for s in streams]

    fake = types.SimpleNamespace(
        Decoder=Decoder, Backend=lambda kind: kind, CodeStream=lambda data: data,
        BackendKind=types.SimpleNamespace(HW_GPU_ONLY="HW_GPU_ONLY"),
        DecodeParams=lambda **kw: kw, ColorSpec=types.SimpleNamespace(UNCHANGED="UNCHANGED"),
        SampleFormat=types.SimpleNamespace(P_YUV="P_YUV", I_RGB="I_RGB", NV12="NV12"))
    monkeypatch.setitem(sys.modules, "nvidia", types.SimpleNamespace(nvimgcodec=fake))
    monkeypatch.setitem(sys.modules, "nvidia.nvimgcodec", fake)
    stream = types.SimpleNamespace(handle=99, synchronize=lambda: waits.append(len(calls)),
                                   current=made_current)
    decodes = second_stream.JpegDecodes(3, stream)
    decodes.decode(150, "P_YUV")  # in the JPEG's own colours: nvImageCodec refuses P_YUV in sRGB
    decodes.decode(10, "I_RGB")
    assert calls == [(64, "P_YUV", "UNCHANGED", 99), (64, "P_YUV", "UNCHANGED", 99),
                     (22, "P_YUV", "UNCHANGED", 99), (10, "I_RGB", None, 99)]
    assert waits == [1, 2, 3, 4]
    image = PIL.Image.open(io.BytesIO(decodes._code_streams[0]))
    assert (image.format, image.size, image.layer) == ("JPEG", (500, 375), [
        (1, 2, 2, 0), (2, 1, 1, 1), (3, 1, 1, 1)])  # luma sampled 2 x 2 against chroma: 4:2:0
    with pytest.raises(RuntimeError, match="refused a JPEG into NV12"):
        decodes.decode(1, "NV12")


class _CaptureDriver(_FakeDriver):
    """As _FakeDriver, recording the capture, graph and synchronize calls in order."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __getattr__(self, name):
        if name.startswith(("cuStream", "cuGraph")) and name != "cuStreamCreateWithPriority":
            return lambda *args: self.calls.append(name) or 0
        return super().__getattr__(name)


class _FakeDecoder:
    """nvImageCodec's decoder that fails (raises) or gives no image, as a capture may make it."""

    def __init__(self, fails: bool) -> None:
        self.fails = fails

    def decode(self, code_streams, images, params, cuda_stream):
        assert len(images) == len(code_streams)
        if self.fails:
            raise RuntimeError("operation not permitted when stream is capturing")
        return [None] * len(code_streams)


@pytest.mark.parametrize("fails, error", [
    (True, "decode: RuntimeError: operation not permitted when stream is capturing"),
    (False, "decode: a JPEG gave no image under capture")])
def test_a_failed_capture_is_recorded_and_still_ended(monkeypatch, fails, error):
    # The stream must leave capture even when the decode under it fails, and no graph is made.
    from jia_jax import cuda_stream

    driver = _CaptureDriver()
    monkeypatch.setattr(cuda_stream.ctypes, "CDLL", lambda name: driver)
    decodes = object.__new__(second_stream.JpegDecodes)
    decodes._stream = cuda_stream.CudaStream(0)
    decodes._decoder, decodes._params = _FakeDecoder(fails), lambda sample_format: None
    decodes._io = ([b"jpeg"] * 64, [object()] * 64, 1234)  # made before any capture
    report = decodes.decode_captured(128)
    assert report == {"capture_error": error, "decoded_mean": None}
    assert driver.calls == ["cuStreamBeginCapture_v2", "cuStreamEndCapture"]


_GREEN_CALLS = (
    "cuDeviceGetDevResource", "cuDevSmResourceSplitByCount", "cuDevResourceGenerateDesc",
    "cuGreenCtxCreate", "cuCtxFromGreenCtx", "cuGreenCtxStreamCreate", "cuModuleLoadData",
    "cuModuleGetFunction", "cuLaunchKernel")


class _GreenDriver(_FakeDriver):
    """As _FakeDriver, with green contexts: the SMs split off are 8 more than asked for (CUDA
    rounds up to its granularity), written where cuda.h puts an SM resource's count."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __getattr__(self, name):
        if name in _GREEN_CALLS:
            self.calls.append(name)
        return super().__getattr__(name)

    def _cuDevSmResourceSplitByCount(self, result, groups, whole, rest, flags, minimum):
        ctypes.c_uint.from_buffer(result, 96).value = minimum + 8
        return 0

    def _cuGreenCtxStreamCreate(self, stream, green, flags, priority):
        stream._obj.value = 99
        return 0


def test_a_green_context_is_made_once_and_its_stream_launches(monkeypatch):
    from jia_jax import cuda_stream

    driver = _GreenDriver()
    monkeypatch.setattr(cuda_stream.ctypes, "CDLL", lambda name: driver)
    green = second_stream.EmptyKernels.on(second_stream.GreenStream(0, 16))
    assert (green.stream.sms, green.stream.handle) == (24, 99)
    green.launch(3)
    assert driver.calls == [*_GREEN_CALLS, "cuLaunchKernel", "cuLaunchKernel"]
