"""Defaults shared by every config: ResNet-50 on ImageNet at the classic batch of 256.

Run:
  python -m jia_jax.main --config=configs/default.py --workdir=/tmp/jia_jax/default \
      --config.data.data_dir=/path/to/tensorflow_datasets
"""

import ml_collections

MIB = 1 << 20


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.seed = 0

    # `name` picks the architecture; the other fields are passed to its constructor.
    # `space_to_depth_stem` and `sliced_max_pool` compute the same function in fewer memory
    # passes or kernels (the model docstrings say how). On one GPU each alone made the ResNet-50
    # step 2-3% faster at 256 and 64 images, against plain layers with a two-pass BatchNorm
    # variance; with both, beside today's one-pass layers, the step ran 1.074x the same step
    # with the plain layers at 256 images (docs/benchmarks.md, "One GPU").
    config.model = ml_collections.ConfigDict(
        {
            "name": "resnet50",
            "space_to_depth_stem": True,
            "sliced_max_pool": True,
        }
    )

    config.data = ml_collections.ConfigDict()
    config.data.name = "imagenet2012"
    config.data.data_dir = ml_collections.config_dict.placeholder(str)
    config.data.image_size = 224
    config.data.num_classes = 1000  # used only by `synthetic`; real datasets report their own
    config.data.train_split = "train"
    config.data.eval_split = "validation"
    # Input worker processes per training process (tfds datasets); about the CPU cores each
    # process can spare. A GPU needs its step's images/s / the images/s per core that
    # scripts/bench/input.py measures on the host (docs/input_pipeline.md, "Cores per GPU").
    config.data.num_workers = 0
    # Unreadable records (bad JPEG bytes, a failed checksum) a tfds dataset may have before the
    # run stops, naming file and record; each is logged and replaced by the next readable one.
    config.data.max_bad_records = 0
    # Where a tfds dataset's JPEGs are decoded: "cpu" (Pillow, in the num_workers processes),
    # "gpu" (nvImageCodec, `pip install -e ".[gpu]"`; the host then only reads the records), or
    # "auto": the GPU where JAX runs on GPUs and nvImageCodec is installed, else the CPU. Both
    # give the same examples and crop windows (docs/input_pipeline.md).
    config.data.decode = "auto"
    # GPU decoding: side of the square tiles each JPEG is decoded into. 512 holds an ImageNet-sized
    # image (500 x 375) whole in one tile; a larger image takes several around its crop.
    config.data.gpu_canvas = 512
    # GPU decoding: chroma upsampled by interpolation, as Pillow (the CPU path) does, so both
    # paths' pixels agree to a few levels of 255; False repeats chroma samples instead (nvJPEG's
    # faster default; up to 31 levels from the CPU path's crops, docs/input_pipeline.md).
    config.data.gpu_fancy_upsampling = True
    # GPU decoding: nvImageCodec's decoder options besides that one, space-separated
    # `module:option=value` (its documentation lists them), e.g.
    # "nvjpeg_hw_decoder:preallocate_batch_size=256" to size the hardware decoder's buffers up
    # front instead of growing them batch by batch (on one H200 no faster end to end,
    # docs/input_pipeline.md, "Tuning"). "" leaves the library's defaults.
    config.data.gpu_decoder_options = ""
    # GPU decoding: decoders per GPU taking the batches in turn, each with its own CUDA stream
    # and tile ring (another ring of tiles in GPU memory each). Each decoder already prepares its
    # next batch on the host while it decodes one; 2 decoders also decode two batches at once:
    # faster alone, not beside ResNet-50's step on one H200 (docs/input_pipeline.md, "Tuning").
    config.data.gpu_decode_depth = 1
    # GPU decoding: tile arrays each decoder keeps per tile count, in XLA's memory (0.2 GB each
    # at 256 images of the 512 canvas). The decoder runs at most this many batches ahead of the
    # crops that read them; on one H200 host, 8 trained 1.055x faster than 4 at 256 images
    # (docs/input_pipeline.md, "How fast it is").
    config.data.gpu_tile_ring_depth = 8
    # GPU decoding: the crop's products. "pallas": kernels that read only each crop's window and
    # convert the uint8 pixels as they load them (a GPU whose canvas is a multiple of 16 and
    # image_size at least 9); "xla": XLA's products over whole tiles. The same crops; "pallas"
    # takes less GPU time and trained as fast or faster on one H200 (docs/input_pipeline.md).
    config.data.gpu_crop_kernel = "pallas"

    config.global_batch_size = 256
    config.eval_batch_size = 256
    # Per-device images per forward/backward pass; a larger per-device batch accumulates gradients
    # over microbatches of this size (each its own BatchNorm batch). 0: no accumulation.
    config.microbatch_size = 0
    config.num_epochs = 90.0
    config.total_steps = -1  # -1: derived from num_epochs and the train-set size

    # -1 infers: node = number of processes, gpu = devices per process.
    config.mesh = ml_collections.ConfigDict({"node": -1, "gpu": -1})
    # Set the first three only for a hand-rolled launcher; SLURM and mpirun are detected.
    config.distributed = ml_collections.ConfigDict(
        {
            "coordinator_address": ml_collections.config_dict.placeholder(str),
            "num_processes": ml_collections.config_dict.placeholder(int),
            "process_id": ml_collections.config_dict.placeholder(int),
            # A process that exits, or is silent this long, has stopped: the others stop with
            # one line naming it and the checkpoint to resume from (jia_jax/peer_watch.py).
            # Must exceed the longest time a busy host leaves the watch's thread unrun.
            "heartbeat_timeout_s": 30,
            # False: no watch (JAX's own coordination service aborts the survivors after
            # heartbeat_timeout_s instead, with a dump of every thread).
            "watch_peers": True,
            # "auto": a single training process on a machine of several GPUs that would decode
            # JPEGs on them starts one process per GPU instead (0.971 of the synthetic speed on
            # two H200s against 0.745 as one; jia_jax/process_per_gpu.py). "always" for any
            # data, "never" trains in one process.
            "process_per_gpu": "auto",
        }
    )

    # How the train step's kernels reach the GPU. `convolution_graphs`: cuDNN's convolutions in
    # XLA's command buffers (CUDA graphs) too, with the fusions around them, instead of launched
    # one by one between graphs ("auto": on GPUs, unless XLA_FLAGS sets
    # --xla_gpu_enable_command_buffer; or "always", "never"). The first step runs without them
    # (jia_jax/step_graphs.py says why). The same step: on one H200 1.007x / 1.026x faster at
    # 256 / 64 images per GPU, the host's launch of a step halved at 64 (docs/benchmarks.md,
    # "Convolutions in command buffers, primed").
    config.launch = ml_collections.ConfigDict({"convolution_graphs": "auto"})

    config.precision = ml_collections.ConfigDict()
    config.precision.compute = "bfloat16"
    # Dynamic loss scaling, used only with float16 compute.
    config.precision.loss_scale = ml_collections.ConfigDict(
        {"initial": 2.0**15, "growth_interval": 2000, "factor": 2.0, "minimum": 1.0}
    )
    # A run whose steps all overflow at the minimum scale this many times in a row has diverged:
    # it stops (naming the step) instead of finishing with untrained parameters.
    config.precision.loss_scale.max_skips_at_minimum = 100

    config.optimizer = ml_collections.ConfigDict()
    config.optimizer.name = "sgd"
    config.optimizer.base_learning_rate = 0.1  # per 256 images (linear scaling rule)
    config.optimizer.learning_rate = config.optimizer.get_ref("base_learning_rate") * (
        config.get_ref("global_batch_size") / 256
    )
    config.optimizer.momentum = 0.9
    config.optimizer.nesterov = False
    config.optimizer.weight_decay = 1e-4
    config.optimizer.trust_coefficient = 0.001
    config.optimizer.warmup_epochs = 5.0
    config.optimizer.decay = "cosine"
    config.optimizer.power = 2.0
    config.optimizer.end_learning_rate = 0.0

    config.loss = ml_collections.ConfigDict({"label_smoothing": 0.1})

    # Gradient all-reduce (jia_jax/allreduce.py); measured in docs/benchmarks.md.
    config.comm = ml_collections.ConfigDict()
    config.comm.strategy = "xla"
    # Tensor fusion threshold: 16 MiB gave the fastest ResNet-50 step on 4 GPUs (4-64 MiB were
    # within 1 ms of it).
    config.comm.bucket_bytes = 16 * MIB
    # The first bucket's limit (0: `bucket_bytes`). Backward produces the last layers' many
    # gradients in a burst: one larger first bucket leaves once, where smaller ones would queue
    # behind each other on the wire (docs/benchmarks.md, "Across hosts").
    config.comm.first_bucket_bytes = 0
    # The last bucket's limit (0: none of its own), counted from the end: backward produces the
    # stem's and the first stage's gradients last, and their bucket can only leave after it; a
    # small last bucket lets the gradients before it leave while the first stage's backward runs.
    # Applied only where the buckets are packed during backward (`pack_after_backward`).
    config.comm.last_bucket_bytes = 0
    # Start each bucket's all-reduce as soon as backward has packed it, where XLA would wait
    # (`train.step_compiler_options`). Across a slow network with 256 images per GPU, with a
    # 32 MiB first bucket, it hides more of the wire; with 64 it loses (docs/benchmarks.md).
    config.comm.start_when_ready = False
    # The dtype on the wire: "float32", "bfloat16", "float16" (with fp16 compute) or, with an
    # explicit strategy, "float8_e4m3fn" (half bf16's bytes across the network, each chunk scaled
    # into fp8: jia_jax/fp8_wire.py).
    config.comm.dtype = "float32"
    # `hybrid`: buckets below this go hierarchical. Not yet measured across nodes (one host only):
    # the value follows Jia et al.'s finding that hierarchical wins for small messages.
    config.comm.hybrid_crossover_bytes = 4 * MIB
    # Explicit strategies: each bucket's collective runs while backward computes the buckets after
    # it (`allreduce.hold_until_all_reduced`; docs/benchmarks.md, "Across hosts"). Same mean.
    config.comm.overlap = True
    # With `overlap`: release the buckets before the last to the optimizer once backward has
    # packed the last one, so their update (LARS is per layer) runs while the last bucket's
    # all-reduce is on the wire, instead of after it. Same values. Applied only where the
    # buckets are packed during backward; measured across hosts only (on in
    # configs/resnet50_64k.py), so off here.
    config.comm.release_before_last = False
    # Explicit strategies: pack the buckets only once backward has produced every gradient
    # ("always"), or as it produces them ("never"), or "always" where the mesh has one node or
    # its nodes are processes of one host ("auto"). Packed during backward with the vectors among
    # the kernels, BatchNorm's backward was fused worse by XLA (ReLU's mask written out): on two
    # H200s after backward was 4.2% faster at 256 images per GPU in one process, 3.7% as two
    # (docs/benchmarks.md), a fusion `comm.vectors_last` mends during backward (with it, during
    # kept 0.974 of two H200s against after's 0.977 in one call); across hosts the buckets must
    # leave during backward to hide the wire time. Same mean.
    config.comm.pack_after_backward = "auto"
    # Explicit strategies: copy each bucket's gradients into one array for its all-reduce (True),
    # or send the leaves themselves, whose all-reduces XLA's combiner merges (False: no copy, and
    # no concatenation for backward's fusions to work around). Across 2 emulated hosts of one
    # H200: no faster at 256 images per GPU, faster queued and slower synced at 64, in one call
    # (docs/benchmarks.md, "Across hosts"). Same mean, up to summation order.
    config.comm.concatenate_buckets = True
    # Explicit strategies: pack the vectors' gradients (BatchNorm's scale and bias, biases) after
    # the kernels', into the last bucket, held until all exist. Consumed by the buckets that leave
    # during backward, they made XLA fuse BatchNorm's backward worse (ReLU's mask written out);
    # held for the last bucket, XLA fuses it as without buckets: across 2 emulated hosts of one
    # H200 the trainer kept 0.947 of two GPUs at 256 images per GPU and 0.786 at 64, against
    # 0.930 and 0.724 (docs/benchmarks.md, "Why does the step compute longer across hosts?").
    # Same mean.
    config.comm.vectors_last = True
    # The links `comm.strategy='auto'` plans for (jia_jax/comm_model.py, `network_model`) when
    # the run spans processes: "" the calibration's default fabric (a published 400 Gb/s
    # InfiniBand), a fabric name of jia_jax/comm_calibration.json, or "emulated": processes that
    # are hosts emulated on one machine (scripts/launch_local.sh --hosts passes it). Same mean.
    config.comm.network = ""
    # In a run across hosts, tell XLA's latency-hiding scheduler the GPUs per host and
    # `comm.network`'s bandwidth and latency, so that it starts each bucket's all-reduce early
    # enough for that network (jia_jax/xla_network.py; set by `jia_jax.main` before JAX starts),
    # and cap XLA's combining at `bucket_bytes`, so that each bucket leaves where it is packed.
    # Off, XLA assumes 8 GPUs a host and a fast network: across 2 emulated hosts the trainer ran
    # 3-7% slower (docs/benchmarks.md). On one host: no effect. Same mean.
    config.comm.tell_xla_network = True
    # The share of `comm.network`'s bandwidth told to XLA where it is told. XLA keeps one
    # all-reduce in flight and places each bucket's start and done by the told wire time: told
    # less, it starts the buckets earlier in backward. Told half across 2 emulated hosts, the
    # in-process step ran about 1.5% slower at 256 images per GPU and 8.6% faster at 64, within
    # the link's spread between runs (docs/benchmarks.md, "Across hosts"). Same mean.
    config.comm.told_bandwidth_scale = 1.0

    # A jax.profiler trace of `steps` steps from `first_step` (-1: none) in
    # <workdir>/profile/process_<i>, for TensorBoard's profile plugin or scripts/bench/hosts.py.
    # `python`: with every Python call of every thread, which slows the host's part of a step;
    # False for a trace whose device idle time is an untraced run's.
    config.profile = ml_collections.ConfigDict({"first_step": -1, "steps": 5, "python": True})

    config.log_every_steps = 100
    config.eval_every_steps = 5000
    config.checkpoint_every_steps = 5000
    config.checkpoint_keep = 3
    # Resuming a checkpoint with a config that changes the run's maths (jia_jax/recipe.py,
    # FREE_ON_RESUME) stops with the differences; True resumes anyway.
    config.allow_config_change = False
    return config
