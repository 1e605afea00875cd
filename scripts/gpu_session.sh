#!/usr/bin/env bash
# One GPU sitting's checks and timings, each step under its own time limit with its own log,
# its table printed as it finishes (a step cut short loses only itself).
#
#   bash scripts/gpu_session.sh timings [OUT_DIR]   # decode, first token, profiles, quantized matmuls (~8 min on an H100)
#   bash scripts/gpu_session.sh throughput [OUT_DIR]  # engine vs HF serving throughput, Llama-3.2-1B shape (4.3 min on an H200)
#   bash scripts/gpu_session.sh quant [OUT_DIR]     # bf16/int8/int4/fp8 decode, Llama-3.2-1B shape (~3 min, untried)
#   bash scripts/gpu_session.sh serving-quant [OUT_DIR]  # the Triton quantized matmul checked on the model path,
#                                                   # then 'throughput' and a shorter 'quant' (7 min on an H200)
#   bash scripts/gpu_session.sh decode-gaps [OUT_DIR]  # engine throughput without HF, then batch-1 decode
#                                                   # traced as is and with cuBLAS for every dot (~7 min)
#   bash scripts/gpu_session.sh gemv [OUT_DIR]     # batch-1 products of a 1B MLP's shapes: XLA's Triton gemm,
#                                                   # cuBLAS and the Pallas strip kernel (bf16/int8/int4); then
#                                                   # batch-1 decode at 8 and 32 steps a call, and its trace (~6 min)
#   bash scripts/gpu_session.sh quant-check [OUT_DIR]  # batch-1 bf16/int8/int4 decode, the int8/int4 tiling
#                                                   # sweep, the quantized kernels' GPU tests, the engine tests (~8 min)
#   bash scripts/gpu_session.sh engine-suite [OUT_DIR]  # the engine's sampling, speculation and random-mix
#                                                   # tests and generate's, on 12 workers (~4 min)
#   bash scripts/gpu_session.sh joined [OUT_DIR]   # batch-1 and -8 decode with q/k/v and gate/up joined vs
#                                                   # split, bf16/int8/int4, then a batch-1 trace (~5 min, untried)
#   bash scripts/gpu_session.sh command-buffers [OUT_DIR]  # batch-1 bf16/int8/int4 decode as is, then with the
#                                                   # decode loop's while and conditionals in CUDA graphs too,
#                                                   # and that run's trace (~5 min, untried)
#   bash scripts/gpu_session.sh serving [OUT_DIR]  # batch-1/-8 decode over the copy bandwidth, paged attention
#                                                   # at batch 8/32 and 4k/16k context, launch to healthy cold and
#                                                   # warm, bench serve at concurrency 1/8/64 (~7 min, untried);
#                                                   # needs the wheels of scripts/gpu_wheels.sh carried
#   bash scripts/gpu_session.sh overlap [OUT_DIR]  # the engine's host share and tok/s with async_scheduling
#                                                   # off and on (Llama-3.2-1B shape, 128 requests; overlap_outputs
#                                                   # off was measured on 2026-11-27), then warm-up cold, warm
#                                                   # from JAX's cache (traced) and warm from the program store
#                                                   # (untraced), with its trace/compile split (~7 min, untried)
#   bash scripts/gpu_session.sh sampling [OUT_DIR]  # what choosing a token costs a decode step at batch 1/8/64
#                                                   # (128256 vocabulary): the branchless work every GPU step
#                                                   # and verify round does against an argmax, float vs int-key
#                                                   # sort, top_k(20) vs top-16 parts; then LoRA adapter
#                                                   # slots' cost at batch 1/8 (bench_lora.py) (~4 min, untried)
#   bash scripts/gpu_session.sh warmup-threads [OUT_DIR]  # engine warm-up on 8 compile threads vs 1 (~6 min)
#   bash scripts/gpu_session.sh gpt-oss [OUT_DIR]  # GPT-OSS on the GPU: the attention-sink kernels compiled,
#                                                   # the family's engine and MXFP4 tests, then bf16 decode at
#                                                   # batch 1/8 of gpt-oss-20b's layer (6 of its 24 layers, a
#                                                   # 12 GB random checkpoint) vs HF (~7 min, untried)
#   bash scripts/gpu_session.sh moe [OUT_DIR]      # routed experts on the GPU: the expert tests (float and
#                                                   # quantized), then ragged_dot vs gathered products at
#                                                   # gpt-oss-20b's and Mixtral's expert shapes, 1-2048 tokens,
#                                                   # bf16/int8/int4/fp8 experts, over the copy bandwidth; then
#                                                   # gpt-oss-20b's 6 layers decoding with bf16/int8/int4
#                                                   # experts (~7 min, untried)
#   bash scripts/gpu_session.sh families [OUT_DIR]  # the families of 2026-11-29 on the GPU: their parity,
#                                                   # engine and router tests (DeepSeek's latent attention
#                                                   # included: it takes the jnp path there), then bf16 decode
#                                                   # at batch 1/8 of DeepSeek-V2-Lite's and GLM-4.5-Air's
#                                                   # shapes (4 and 2 random layers) vs HF (~8 min, untried)
#   bash scripts/gpu_session.sh weights [OUT_DIR]  # weight updates and sleep mode on the GPU: their tests,
#                                                   # then each way of serving new weights (a pytree on the
#                                                   # device, HF-named host tensors, from disk, sleep 1/2)
#                                                   # against a new LLM and the copy bandwidth, Llama-3.2-1B
#                                                   # shape in bf16 (~5 min, untried)
#   bash scripts/gpu_session.sh features [OUT_DIR]  # LLaVA, classify/score/rerank, the Responses API, tool-call
#                                                   # streaming, Llama 4's chunked attention and the 4-bit
#                                                   # checkpoints' tests on the GPU, 8 workers (~7 min, untried)
#   bash scripts/gpu_session.sh features2 [OUT_DIR]  # what landed on 2026-11-29 (second sitting) on the GPU:
#                                                   # encoders, Qwen2-VL, Mistral 3, Idefics3, prompt_embeds,
#                                                   # Mamba2 and the hybrids (the chunked SSD runs there), MTP;
#                                                   # then Mamba2 prefill, per-token scan vs chunked SSD, at
#                                                   # T = 512/2048/8192, chunks of 64/256 (~8 min, untried)
#   bash scripts/gpu_session.sh features3 [OUT_DIR]  # what landed on 2026-11-29 (third sitting) on the GPU:
#                                                   # KV offloading, Qwen3-Next (its chunked delta rule runs
#                                                   # there), Qwen3-VL, InternVL, Falcon-H1, LFM2, Whisper and its
#                                                   # server (python-multipart: carry .whl); then turn 2 of a
#                                                   # 4096-token conversation with the host tier against
#                                                   # recomputing it, Llama-3.2-1B shape, bf16 (~8 min, untried)
#   bash scripts/gpu_session.sh features4 [OUT_DIR]  # what landed on 2026-11-29 (fourth sitting) on the GPU:
#                                                   # Qwen3.5 (text and images), Gemma 4, MiniMax-M2, LFM2-MoE,
#                                                   # the bucketed Qwen-VL and Pixtral towers, Whisper's paged
#                                                   # cross-attention through the Pallas kernel, the tool-call
#                                                   # parsers (~6 min, untried)
#   bash scripts/gpu_session.sh features5 [OUT_DIR]  # what landed on 2026-11-29 (fifth sitting) on the GPU:
#                                                   # GPT-2/NeoX/Phi, GLM-4.7-Flash, Mistral 4, dots1, HunYuan,
#                                                   # Solar Open, Sarvam-MoE, EXAONE-MoE, MiMo-V2-Flash,
#                                                   # DeepSeek-V3.2's sparse attention, Kimi Linear's
#                                                   # per-channel delta rule, Gemma 4's vision tower, the
#                                                   # token filters and vLLM's argument names (~6 min, untried)
#   bash scripts/gpu_session.sh features6 [OUT_DIR]  # what landed on 2026-11-29 (sixth sitting) on the GPU:
#                                                   # OPT, GPT-J, GPTBigCode, StableLM, Falcon, Phi-3.5-MoE, DBRX,
#                                                   # MiniCPM3, Gemma 3n, Mamba, FalconMamba, Jamba, LFM3, Laguna, Cohere2-MoE, LongCat-Flash, BLOOM, MPT,
#                                                   # Mistral Large 4, Mamba-1's chunked selective scan
#                                                   # (ALiBi: the Triton kernel compiled), then
#                                                   # bench_selective.py: Mamba-1's token scan against
#                                                   # the chunked form at T = 512 to 8192 (~8 min, untried)
#   bash scripts/gpu_session.sh features7 [OUT_DIR]  # what landed on 2026-11-30 (seventh sitting) on the GPU:
#                                                   # 25 families (OPT-350M, OLMo 1, Ministral, Helium, CWM,
#                                                   # FlexOlmo, Mellum 2, Jais 2, HyperCLOVA X, Youtu, Kolibri-1,
#                                                   # VaultGemma, Persimmon, JetMoE, nanochat, GPT-Neo, CodeGen,
#                                                   # Flint, A.X-K1, BitNet, Hy3, Granite SWA, Granite-MoE SWA,
#                                                   # AFMoE), HY-V4's hyper-connections, Qwen4-Exp, Zamba2, the
#                                                   # Gemma 4 assistant's draft step, LLM.encode's pooling, fixed
#                                                   # token masks over multi-step calls (~7 min, untried)
#   bash scripts/gpu_session.sh features8 [OUT_DIR]  # what landed on 2026-11-30 (eighth sitting) on the GPU:
#                                                   # 17 families' logits (DeepSeek-V4, Dory, HRM-Text, Beam,
#                                                   # ZAYA, Doge, DiffLlama, LaraMini, A.X-K2, OLMo Hybrid, Ling
#                                                   # hybrid, MiniMax-M3, Step 3.7, Muse Glimmer/Spark, Gemma 4
#                                                   # Unified, Cohere Compass), Inkling and MiniMax-Text-01 on
#                                                   # the engine, LLaVA-NeXT/OneVision, the Gemma 4 assistant
#                                                   # drafting in the engine (Pallas pages on a GPU, never run
#                                                   # before), a fixed token mask over verify rounds (~7 min, untried)
#   bash scripts/gpu_session.sh features9 [OUT_DIR]  # what landed on 2026-11-30 (ninth sitting) on the GPU:
#                                                   # PaliGemma's whole-prompt prefix, VipLLaVA, Aya Vision,
#                                                   # Cohere2 Vision, GLM-4.xV, Idefics2, Mllama's tower and
#                                                   # text, LFM2-VL text, Qwen-VL video, RecurrentGemma and
#                                                   # Zamba (the RG-LRU's chunked scan, never run on a GPU),
#                                                   # priority scheduling, parsers, HTTPS serving (~7 min, untried)
#   bash scripts/gpu_session.sh suite-all [OUT_DIR]  # the whole suite on 14 workers, verbose (a run cut
#                                                   # short still shows each test's result), then
#                                                   # gpu_check.py's correctness checks (~9 min)
#   bash scripts/gpu_session.sh suite-slow [OUT_DIR]  # the files whose tests suite-all left unfinished on an
#                                                   # H200 (speculative sampling statistics, EAGLE and
#                                                   # draft-model engine runs, random mixes), with durations (~8 min)
#   bash scripts/gpu_session.sh suite 1 [OUT_DIR]   # the first half of the test files on the GPU (~9 min)
#   bash scripts/gpu_session.sh suite 2 [OUT_DIR]   # the second half
#   bash scripts/gpu_session.sh train-pair [OUT_DIR]  # issue 51's next demo pair: an 11M target and a distilled
#                                                   # 2.6M draft on the stdlib and the permissively licensed
#                                                   # packages there (train_pair.py), an EAGLE-3 head for the
#                                                   # target; all packed as pair.tar.part-* of <= 15 MiB
#                                                   # (`cat pair.tar.part-* | tar -xf -`) (~8.5 min; an H200
#                                                   # trained the pair in 241 s on 2026-11-29)
#   bash scripts/gpu_session.sh spec-pair [OUT_DIR]  # right after train-pair, on the same warm machine: the
#                                                   # new pair's draft model, n-gram (host and device) and EAGLE-3 head against
#                                                   # plain at batch 1, greedy and t=0.8 (issue 51's 2x
#                                                   # targets; ~5 min, untried)
#   bash scripts/gpu_session.sh runtime [OUT_DIR]  # issue 52's GPU targets, Llama-3.2-1B shape, default knobs:
#                                                   # program count, warm-up cold/warm on 8 threads, the
#                                                   # branchless/lowering tests, host share of a step, batch-1
#                                                   # decode vs HF (~8 min, untried)
#
# Each mode fits one device call (10 minutes at most), so no call cuts a later step off.
# The server and some tests need packages the GPU image lacks: run `bash scripts/gpu_wheels.sh` here first
# and carry .whl with the call (the device tool's carry [".whl"]); this script installs them into /tmp/site.
#
# A rehearsal on a CPU runs a mode end to end before a sitting spends device time on it: e.g.
#   GPU_SESSION_PRESET=smollm-135m GPU_SESSION_STRETCH=4 GPU_SESSION_THREADS=2 bash scripts/gpu_session.sh serving /tmp/out
# (a smaller model shape, each step's limit x4, fewer compile threads; 2026-11-28 every mode ran through so).
set -u
cd "$(dirname "$0")/.."
preset=${GPU_SESSION_PRESET:-llama-3.2-1b}  # the model shape every step runs
stretch=${GPU_SESSION_STRETCH:-1}  # each step's time limit multiplied by this
threads=${GPU_SESSION_THREADS:-8}  # warm-up's compile threads
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2
if [ -d .whl ]; then  # the server's and the tests' packages the image lacks (scripts/gpu_wheels.sh), carried
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=.:/tmp/site${PYTHONPATH#.}
fi

step() {  # step NAME SECONDS COMMAND...: run it, keep its log, show its last lines without progress bars
    local name=$1 limit=$2 start=$SECONDS
    shift 2
    timeout "$((limit * stretch))" "$@" >"$out/$name.log" 2>&1
    echo "== $name: exit $? after $((SECONDS - start)) s"
    tr '\r' '\n' <"$out/$name.log" | grep -vE '^\s*$|loading |Loading |Writing model' | tail -n 30
}

case "${1:-}" in
timings)
    out=${2:-results/gpu_session}
    mkdir -p "$out"
    step timings 240 python3 scripts/gpu_check.py --only timings --out "$out/gpu_check.json"
    step profile_b1 90 python3 scripts/profile_decode.py --preset "$preset" --batch 1 --out "$out"
    step profile_b8 90 python3 scripts/profile_decode.py --preset "$preset" --batch 8 --out "$out"
    step quant_matmul 90 python3 scripts/bench_quant_matmul.py --out "$out/bench_quant_matmul.json"
    ;;
throughput)
    out=${2:-results/gpu_session}
    mkdir -p "$out"
    # The untimed warm-up pass compiles the ~27 step programs this workload uses (a CPU run's count).
    step throughput 560 python3 scripts/bench_throughput.py --models "$preset" --hf-batches 4
    ;;
quant)
    out=${2:-results/gpu_session}
    mkdir -p "$out"
    step quant 500 python3 scripts/bench_quant.py --preset "$preset" --formats bf16 int8 int4 fp8 \
        --out "$out/bench_quant.json"
    ;;
serving-quant)
    out=${2:-results/gpu_session}
    mkdir -p "$out"
    ckpt=/tmp/jaxinfer_bench  # one random 1B checkpoint for both benchmarks
    PALLAS_KERNELS_DEVICE_TESTS=gpu step kernel_checks 120 python3 -m pytest -v -p no:cacheprovider -rfE \
        tests/pallas_kernels/test_quant_matmul_gpu.py tests/test_quantized_kernel_path.py -k "gpu or triton or llm_with"
    step throughput 320 python3 scripts/bench_throughput.py --models "$preset" --hf-batches 2 \
        --checkpoints "$ckpt"
    cp results/bench_throughput_*.json "$out"/ 2>/dev/null
    step quant 190 python3 scripts/bench_quant.py --preset "$preset" --batches 1 --repeats 3 \
        --formats bf16 int8 int4 fp8 int8-xla int4-xla --model-dir "$ckpt" --out "$out/bench_quant.json"
    ;;
gpt-oss)
    out=${2:-results/gpu_session}
    mkdir -p "$out"
    PALLAS_KERNELS_DEVICE_TESTS=gpu step sinks_tests 150 python3 -m pytest -v -p no:cacheprovider -rfE \
        tests/pallas_kernels/test_paged_attention.py tests/test_attention_sinks.py tests/test_mxfp4.py \
        tests/test_families.py -k "gpu_compiled or sinks or mxfp4 or gpt_oss"
    step decode 330 python3 scripts/bench_decode.py --preset gpt-oss-20b-6layers --batches 1 8 --dtypes bfloat16 \
        --repeats 3 --out "$out/bench_decode_gpt_oss.json"
    ;;
moe)
    out=${2:-results/gpu_session}
    mkdir -p "$out"
    step moe_tests 90 python3 -m pytest -v -p no:cacheprovider -rfE tests/test_moe.py tests/test_quantized_experts.py
    step moe_gpt_oss 120 python3 scripts/bench_moe.py --experts 32 --top-k 4 --hidden 2880 --intermediate 2880 \
        --tokens 1 8 64 512 2048 --formats bfloat16 int8 int4 fp8 mxfp4 --repeats 5 \
        --out "$out/bench_moe_gpt_oss.json"
    step moe_mixtral 90 python3 scripts/bench_moe.py --experts 8 --top-k 2 --hidden 4096 --intermediate 14336 \
        --tokens 1 8 64 512 --formats bfloat16 int8 int4 --repeats 5 --out "$out/bench_moe_mixtral.json"
    step quant_gpt_oss 150 python3 scripts/bench_quant.py --preset gpt-oss-20b-6layers --batches 1 8 --repeats 3 \
        --formats bf16 int8 int4 --out "$out/bench_quant_gpt_oss.json"
    ;;
families)
    out=${2:-results/gpu_session}
    mkdir -p "$out"
    XLA_PYTHON_CLIENT_PREALLOCATE=false step family_tests 120 python3 -m pytest -v -p no:cacheprovider -rfE -n 8 \
        tests/test_deepseek.py \
        tests/test_glm4_moe.py tests/test_ernie4_5_moe.py tests/test_hf_parity.py tests/test_families.py \
        -k "deepseek or glm or granite or ernie or exaone or seed or router or route or ministral3 or cohere or apertus \
            or arcee or olmoe or nemotron or starcoder2"
    step decode_deepseek 170 python3 scripts/bench_decode.py --preset deepseek-v2-lite-4layers --batches 1 8 \
        --dtypes bfloat16 --repeats 2 --out "$out/bench_decode_deepseek.json"
    step decode_glm45 170 python3 scripts/bench_decode.py --preset glm-4.5-air-2layers --batches 1 8 \
        --dtypes bfloat16 --repeats 2 --out "$out/bench_decode_glm45.json"
    ;;
weights)
    out=${2:-results/gpu_session}
    mkdir -p "$out"
    # The server's routes need FastAPI: carry the wheels of scripts/gpu_wheels.sh (.whl), else they skip.
    XLA_PYTHON_CLIENT_PREALLOCATE=false step weight_tests 150 python3 -m pytest -v -p no:cacheprovider -rfE -n 4 \
        tests/test_weight_updates.py tests/test_weight_routes.py tests/test_int4_checkpoints.py
    step weight_updates 240 python3 scripts/bench_weight_updates.py --preset "$preset" --dtype bfloat16 \
        --out "$out/bench_weight_updates"
    ;;
features)
    out=${2:-results/gpu_session}
    mkdir -p "$out"
    # What landed on 2026-11-29 beside the families, on the GPU (server files need the carried .whl).
    XLA_PYTHON_CLIENT_PREALLOCATE=false step feature_tests 420 python3 -m pytest -v -p no:cacheprovider -rfE -n 8 \
        --durations=15 tests/test_llava.py tests/test_classify.py tests/test_responses_server.py \
        tests/test_tool_parsers.py tests/test_llama4.py tests/test_int4_checkpoints.py tests/test_blocked_attention.py
    ;;
features2)
    out=${2:-results/gpu_session}
    mkdir -p "$out"
    XLA_PYTHON_CLIENT_PREALLOCATE=false step feature2_tests 330 python3 -m pytest -v -p no:cacheprovider -rfE -n 8 \
        --durations=15 tests/test_encoders.py tests/test_qwen2_vl.py tests/test_pixtral.py tests/test_idefics3.py \
        tests/test_prompt_embeds.py tests/test_mamba2.py tests/test_ssd_chunks.py tests/test_granite_moe_hybrid.py \
        tests/test_hybrid_families.py tests/test_engine_mtp.py
    step ssd 120 python3 scripts/bench_ssd.py --tokens 512 2048 8192 --chunks 64 256 --out "$out/bench_ssd.json"
    ;;
features3)
    out=${2:-results/gpu_session}
    mkdir -p "$out"
    XLA_PYTHON_CLIENT_PREALLOCATE=false step feature3_tests 330 python3 -m pytest -v -p no:cacheprovider -rfE -n 8 \
        --durations=15 tests/test_kv_offloading.py tests/test_hybrid_families.py tests/test_delta_chunks.py \
        tests/test_qwen2_vl.py tests/test_internvl.py tests/test_whisper.py tests/test_engine_mtp.py
    step kv_offload 150 python3 scripts/bench_kv_offload.py --preset llama-3.2-1b --dtype bfloat16 \
        --prompt-tokens 4096 --rounds 5 --out "$out/bench_kv_offload.json"
    ;;
features4)
    out=${2:-results/gpu_session}
    mkdir -p "$out"
    XLA_PYTHON_CLIENT_PREALLOCATE=false step feature4_tests 360 python3 -m pytest -v -p no:cacheprovider -rfE -n 8 \
        --durations=15 tests/test_qwen3_5.py tests/test_gemma4.py tests/test_whisper.py tests/test_qwen2_vl.py \
        tests/test_pixtral.py tests/test_hybrid_families.py tests/test_tool_parsers.py tests/test_hf_parity.py \
        -k "not hf_parity or minimax or gemma4"
    ;;
features5)
    out=${2:-results/gpu_session}
    mkdir -p "$out"
    XLA_PYTHON_CLIENT_PREALLOCATE=false step feature5_tests 360 python3 -m pytest -v -p no:cacheprovider -rfE -n 8 \
        --durations=15 tests/test_deepseek_v32.py tests/test_gpt2.py tests/test_gemma4_vision.py \
        tests/test_mimo_v2_flash.py tests/test_delta_chunks.py tests/test_hybrid_families.py \
        tests/test_token_filters.py tests/test_vllm_arguments.py tests/test_mla_families.py tests/test_hf_parity.py \
        -k "not hf_parity or gpt or phi or glm4_moe_lite or mistral4 or dots1 or hunyuan or solar or sarvam or exaone_moe or mimo or deepseek_v32 or glm_moe_dsa"
    ;;
features6)
    out=${2:-results/gpu_session}
    mkdir -p "$out"
    XLA_PYTHON_CLIENT_PREALLOCATE=false step feature6_tests 360 python3 -m pytest -v -p no:cacheprovider -rfE -n 8 \
        --durations=15 tests/test_gemma3n.py tests/test_jamba.py tests/test_classic_family_configs.py \
        tests/test_moe_routers.py tests/test_head_rows.py tests/test_hybrid_families.py tests/test_hf_parity.py \
        tests/test_text_only_wrappers.py tests/test_mla_families.py \
        tests/test_selective_chunks.py \
        tests/test_alibi_attention.py tests/test_families.py::test_bloom_alibi_through_the_paged_cache_keeps_hf_greedy_tokens \
        tests/pallas_kernels/test_ragged_paged_attention.py::test_kernels_take_alibi_slopes \
        tests/pallas_kernels/test_paged_attention.py::test_gpu_compiled \
        -k "not hf_parity or opt or gptj or gpt_bigcode or stablelm or falcon or phimoe or dbrx or minicpm3 or gemma3n or mamba or jamba or lfm3 or laguna or cohere2_moe or longcat_flash or kimi_k25 or apertus1p5 or bloom or mpt or mistral_large4"
    # Mamba-1.4B's mixer (4096 channels), then FalconMamba-7B's and Jamba's (8192): Q = 64 and 32 are the mixer's.
    step selective 120 python3 scripts/bench_selective.py --tokens 512 2048 8192 --chunks 16 32 64 128 256 \
        --out "$out/bench_selective.json"
    step selective_8192 90 python3 scripts/bench_selective.py --inner 8192 --tokens 512 4096 --chunks 16 32 64 \
        --out "$out/bench_selective_8192.json"
    ;;
features7)
    out=${2:-results/gpu_session}
    mkdir -p "$out"
    XLA_PYTHON_CLIENT_PREALLOCATE=false step feature7_tests 420 python3 -m pytest -v -p no:cacheprovider -rfE -n 8 \
        --durations=15 --junitxml="$out/feature7_tests.xml" tests/test_hy_v4.py tests/test_qwen4_exp.py \
        tests/test_gemma4_assistant.py tests/test_light_family_configs.py tests/test_neighbour_family_configs.py \
        tests/test_classic_family_configs.py tests/test_hybrid_families.py tests/test_eagle.py tests/test_embeddings.py \
        tests/test_classify.py tests/test_token_filters.py tests/test_train_pair.py tests/test_moe.py \
        tests/test_hf_parity.py \
        -k "not hf_parity or opt_350m or vaultgemma or persimmon or olmo or ministral or helium or cwm or jetmoe or flex_olmo or mellum or nanochat or gpt_neo or jais2 or hyperclovax or youtu or hy_v4 or kolibri1 or granite_swa or granitemoe_swa or afmoe or codegen or flint or hy_v3 or axk1 or bitnet"
    ;;
features8)
    out=${2:-results/gpu_session}
    mkdir -p "$out"
    XLA_PYTHON_CLIENT_PREALLOCATE=false step feature8_tests 420 python3 -m pytest -v -p no:cacheprovider -rfE -n 8 \
        --durations=15 --junitxml="$out/feature8_tests.xml" tests/test_deepseek_v4.py tests/test_inkling.py \
        tests/test_engine_gemma4_assistant.py tests/test_gemma4_assistant.py tests/test_llava_next.py \
        tests/test_text_only_wrappers.py tests/test_hybrid_families.py tests/test_ssd_chunks.py \
        tests/test_light_family_configs.py tests/test_neighbour_family_configs.py tests/test_engine_ngram_device.py \
        tests/test_token_filters.py tests/test_hf_parity.py \
        -k "not hf_parity or axk2 or bailing_hybrid or beam or cohere_compass or deepseek_v4 or diffllama or doge or dory or gemma4_unified or hrm_text or lara_mini or minimax_m3 or muse_glimmer or muse_spark or olmo_hybrid or step3p7 or zaya"
    ;;
features9)
    out=${2:-results/gpu_session}
    mkdir -p "$out"
    XLA_PYTHON_CLIENT_PREALLOCATE=false step feature9_tests 420 python3 -m pytest -v -p no:cacheprovider -rfE -n 8 \
        --durations=15 --junitxml="$out/feature9_tests.xml" tests/test_paligemma.py tests/test_vipllava.py \
        tests/test_aya_vision.py tests/test_cohere2_vision.py tests/test_glm4v.py tests/test_idefics2.py \
        tests/test_lfm2_vl.py tests/test_mllama.py tests/test_mllama_vision.py tests/test_recurrent_hybrids.py \
        tests/test_selective_chunks.py tests/test_qwen2_vl.py tests/test_priority_scheduling.py \
        tests/test_reasoning_parsers.py tests/test_server_https.py tests/test_generation_flags.py
    ;;
decode-gaps)
    out=${2:-results/gpu_session}
    mkdir -p "$out"
    ckpt=/tmp/jaxinfer_bench
    step throughput 300 python3 scripts/bench_throughput.py --models "$preset" --skip-hf \
        --checkpoints "$ckpt"
    cp results/bench_throughput_*.json "$out"/ 2>/dev/null
    # Batch-1 matrix-vector products streamed at 1.6-2.9 TB/s through XLA's Triton gemm fusions on an H200.
    step profile_b1 60 python3 scripts/profile_decode.py --model "$ckpt/$preset" --batch 1 --top 12 \
        --out "$out/default"
    XLA_FLAGS=--xla_gpu_enable_triton_gemm=false step profile_b1_cublas 60 python3 scripts/profile_decode.py \
        --model "$ckpt/$preset" --batch 1 --top 12 --out "$out/cublas"
    ;;
gemv)
    out=${2:-results/gpu_session}
    mkdir -p "$out"
    ckpt=/tmp/jaxinfer_bench
    step gemv 150 python3 scripts/bench_quant_matmul.py --dims 2048 8192 --layers 32 --batches 1 --repeats 10 \
        --out "$out/gemv.json"
    XLA_FLAGS=--xla_gpu_enable_triton_gemm=false step gemv_cublas 60 python3 scripts/bench_quant_matmul.py \
        --dims 2048 8192 --layers 32 --batches 1 --repeats 10 --formats bf16 --out "$out/gemv_cublas.json"
    step quant 150 python3 scripts/bench_quant.py --preset "$preset" --batches 1 --repeats 3 \
        --formats bf16 int8 int4 --model-dir "$ckpt" --out "$out/bench_quant.json"
    step steps32 70 python3 scripts/bench_quant.py --preset "$preset" --batches 1 --repeats 3 --formats bf16 \
        --decode-steps 32 --model-dir "$ckpt" --out "$out/bench_quant_steps32.json"
    step profile_b1 60 python3 scripts/profile_decode.py --model "$ckpt/$preset" --batch 1 --top 30 \
        --out "$out/trace"
    ;;
quant-check)
    out=${2:-results/gpu_session}
    mkdir -p "$out"
    ckpt=/tmp/jaxinfer_bench
    step quant 120 python3 scripts/bench_quant.py --preset "$preset" --batches 1 --repeats 3 \
        --formats bf16 int8 int4 --model-dir "$ckpt" --out "$out/bench_quant.json"
    step gemv 60 python3 scripts/bench_quant_matmul.py --dims 2048 8192 --layers 32 --batches 1 --repeats 10 \
        --formats int8 int4 --out "$out/gemv.json"
    PALLAS_KERNELS_DEVICE_TESTS=gpu step kernel_checks 150 python3 -m pytest -v -p no:cacheprovider -rfE \
        tests/pallas_kernels/test_quant_matmul_gpu.py tests/test_quantized_kernel_path.py -k "gpu or triton or llm_with"
    XLA_PYTHON_CLIENT_PREALLOCATE=false step engine_tests 200 python3 -m pytest -v -n 8 -p no:cacheprovider -rfE \
        tests/test_engine.py tests/test_step_shapes.py
    ;;
engine-suite)
    out=${2:-results/gpu_session}
    mkdir -p "$out"
    PALLAS_KERNELS_DEVICE_TESTS=gpu XLA_PYTHON_CLIENT_PREALLOCATE=false step engine_suite 240 python3 -m pytest -v \
        -n 12 -p no:cacheprovider -rfE --durations=5 tests/test_engine_random_mix.py tests/test_engine_sampling.py \
        tests/test_engine_speculation.py tests/test_generate.py tests/test_paged_cache.py
    ;;
joined)
    out=${2:-results/gpu_session}
    mkdir -p "$out"
    ckpt=/tmp/jaxinfer_bench
    step joined 300 python3 scripts/bench_quant.py --preset "$preset" --batches 1 8 --repeats 3 \
        --formats bf16 bf16-split int8 int8-split int4 int4-split --model-dir "$ckpt" --out "$out/bench_joined.json"
    step profile_b1 60 python3 scripts/profile_decode.py --model "$ckpt/$preset" --batch 1 --top 30 \
        --out "$out/trace"
    ;;
command-buffers)
    out=${2:-results/gpu_session}
    mkdir -p "$out"
    ckpt=/tmp/jaxinfer_bench
    # An H200 trace of batch-1 decode was 38% idle between kernels: launches. XLA puts fusions and
    # library calls in command buffers (CUDA graphs) by default, not the loop around them.
    graphs=--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL
    step quant 150 python3 scripts/bench_quant.py --preset "$preset" --batches 1 --repeats 3 \
        --formats bf16 int8 int4 --model-dir "$ckpt" --out "$out/bench_quant.json"
    XLA_FLAGS=$graphs step quant_graphs 150 python3 scripts/bench_quant.py --preset "$preset" --batches 1 \
        --repeats 3 --formats bf16 int8 int4 --model-dir "$ckpt" --out "$out/bench_quant_graphs.json"
    XLA_FLAGS=$graphs step profile_b1_graphs 60 python3 scripts/profile_decode.py --model "$ckpt/$preset" \
        --batch 1 --top 20 --out "$out/graphs"
    ;;
runtime)
    out=${2:-results/gpu_session}
    mkdir -p "$out"
    step programs 30 python3 scripts/count_programs.py --out "$out/count_programs.json"
    step warmup 200 python3 scripts/bench_warmup.py --preset "$preset" --threads "$threads" --max-seq-len 2048 \
        --max-num-seqs 64 --max-num-batched-tokens 512 --cold-warm --out "$out/bench_warmup_runtime.json"
    step lowering 60 python3 -m pytest -v -x -p no:cacheprovider tests/test_accelerator_lowering.py \
        tests/test_program_set.py
    # what a warm start pays per step program: layers traced once vs each layer traced (no compiles)
    step layer_tracing 40 python3 scripts/bench_layer_tracing.py --preset "$preset" --programs 3 --no-compile \
        --out "$out/bench_layer_tracing.json"
    # host ms per step and the host's share of the time, beside engine tokens/s (HF on 2 batches, estimated)
    step host_share 150 python3 scripts/bench_throughput.py --models "$preset" --hf-batches 2 \
        --requests 128 --full-warmup
    step decode_b1 60 python3 scripts/bench_decode.py --preset "$preset" --dtypes bfloat16 --batches 1 \
        --out "$out/bench_decode_b1.json"
    ;;
serving)
    out=${2:-results/gpu_session}
    mkdir -p "$out"
    ckpt=/tmp/jaxinfer_bench
    model=$ckpt/$preset
    step decode 120 python3 scripts/bench_decode.py --preset "$preset" --dtypes bfloat16 --batches 1 8 \
        --skip-hf --model-dir "$ckpt" --out "$out/bench_decode.json"
    step attention 90 python3 scripts/bench_attention.py --batch-sizes 8,32 --context-lengths 4096,16384 \
        --head-dim 64 --out "$out/bench_attention.json"
    serve=(--model "$model" --dtype bfloat16 --max-model-len 2048)
    step serve_start 170 python3 scripts/bench_serve_start.py --limit 80 --out "$out/bench_serve_start.json" "${serve[@]}"
    python3 -m jaxinfer serve "${serve[@]}" --port 8011 >"$out/server.log" 2>&1 &
    local_server=$!
    url=http://127.0.0.1:8011
    ready="import sys, time, urllib.request as u
for _ in range(90):
    try:
        sys.exit(u.urlopen('$url/health').status != 200)
    except OSError:
        time.sleep(1)
sys.exit(1)"
    compiled="import re, urllib.request as u
print(re.findall(r'(?m)^\\S+compiled_programs_total (\\S+)$', u.urlopen('$url/metrics').read().decode()))"
    if python3 -c "$ready"; then
        python3 -c "$compiled"
        for c in 1 8 64; do
            step bench_c$c 60 python3 -m jaxinfer bench serve --base-url "$url" --num-prompts $((c * 4 > 16 ? c * 4 : 16)) \
                --input-len 256 --output-len 128 --max-concurrency $c --disable-tqdm --result-file "$out/bench_serve_c$c.json"
        done
        python3 -c "$compiled"
    fi
    kill $local_server
    ;;
overlap)
    out=${2:-results/gpu_session}
    mkdir -p "$out"
    for flag in --no-async ""; do  # off, then on (the default)
        # shellcheck disable=SC2086  # an empty flag is no argument
        step "throughput${flag:+_no_async}" 120 python3 scripts/bench_throughput.py --models "$preset" \
            --skip-hf --requests 128 --full-warmup $flag
    done
    cp results/bench_throughput_*.json "$out"/ 2>/dev/null
    step warmup 200 python3 scripts/bench_warmup.py --preset "$preset" --threads "$threads" --max-seq-len 2048 \
        --max-num-seqs 64 --max-num-batched-tokens 512 --cold-warm --out "$out/bench_warmup_split.json"
    ;;
train-pair)
    out=${2:-results/gpu_session}
    mkdir -p "$out"
    # The corpus took 102 s to prepare on the 2-core CPU (a rehearsal of this mode there, 2026-11-28): the
    # deadline cuts training by what it takes here, so the step ends, and saves the pair, inside its limit.
    step train_pair 300 python3 scripts/train_pair.py --out "$out/pair" --minutes 3.2 --deadline-minutes 4.8
    # On an H200 (2026-11-29) its first step took 117 s, compiling with XLA's gemm autotuning, and the step's
    # limit cut it before saving: autotuning off, and --max-minutes counts from the end of that first step.
    XLA_FLAGS=--xla_gpu_autotune_level=0 XLA_PYTHON_CLIENT_MEM_FRACTION=.6 step train_eagle 250 python3 \
        scripts/train_eagle.py --version 3 --target "$out/pair/target" --out "$out/pair/eagle" --max-minutes 1.5 \
        --steps 100000 --batch-size 32 --seq-len 512 --intermediate-size 512  # ~3.3 MB: the repository carries it
    # Kept on this machine for spec-pair (results/ is ignored, so it stays while the machine is warm).
    mkdir -p results && rm -rf results/pair_gpu && cp -r "$out/pair" results/pair_gpu
    # The device returns files of 16 MiB at most: the pair comes back in pieces.
    tar -C "$out" -cf - pair | split -b 15m - "$out/pair.tar.part-"
    cat "$out"/pair.tar.part-* | tar -xOf - pair/metrics.json
    rm -rf "$out/pair"
    ;;
spec-pair)
    out=${2:-results/gpu_session}
    mkdir -p "$out"
    pair=results/pair_gpu
    [ -d "$pair/eagle" ] || { echo "no $pair: run train-pair first on this (warm) machine"; exit 2; }
    for mode in greedy t=0.8; do
        step "speculative_${mode/=/}" 150 python3 scripts/bench_speculative.py --target "$pair/target" \
            --draft "$pair/draft" --eagle "$pair/eagle" --dtype bfloat16 --no-hf \
            --methods plain draft ngram ngram_device eagle \
            --batches 1 --modes "$mode" --repeats 3 --out "$out/bench_speculative_${mode/=/}.json"
    done
    ;;
sampling)
    out=${2:-results/gpu_session}
    mkdir -p "$out"
    step sampling 150 python3 scripts/bench_sampling.py --rows 1 8 64 --out "$out/bench_sampling.json"
    step lora 240 python3 scripts/bench_lora.py --model "$preset" --dtype bfloat16 --batch 1 8 --tokens 64 \
        --repeats 3 --skip-hf --out "$out/bench_lora.json"
    ;;
warmup-threads)
    out=${2:-results/gpu_session}
    mkdir -p "$out"
    step warmup 560 python3 scripts/bench_warmup.py --preset "$preset" --threads "$threads" 1 --max-num-seqs 4 \
        --max-num-batched-tokens 64 --out "$out/bench_warmup.json"
    ;;
suite-all)
    out=${2:-results/gpu_session}
    mkdir -p "$out"
    PALLAS_KERNELS_DEVICE_TESTS=gpu XLA_PYTHON_CLIENT_PREALLOCATE=false step suite 430 python3 -m pytest -v \
        -n 14 --dist worksteal -p no:cacheprovider -rfEs --durations=20 --timeout 240 --junitxml "$out/suite.xml" tests
    grep -E "FAILED|ERROR" "$out/suite.log" | grep -v "^\[gw" | sort -u | head -n 60
    step checks 90 python3 scripts/gpu_check.py --only checks --out "$out/gpu_check.json"
    ;;
suite-slow)
    out=${2:-results/gpu_session}
    mkdir -p "$out"
    PALLAS_KERNELS_DEVICE_TESTS=gpu XLA_PYTHON_CLIENT_PREALLOCATE=false step suite_slow 470 python3 -m pytest -v \
        -n 15 --dist worksteal -p no:cacheprovider -rfEs --durations=30 --timeout 300 --junitxml "$out/suite.xml" \
        tests/test_speculative_sampling.py tests/test_engine_eagle.py tests/test_engine_draft.py \
        tests/test_engine_random_mix.py tests/test_eagle.py
    ;;
suite)
    half=${2:?suite needs 1 or 2}
    out=${3:-results/gpu_session}
    mkdir -p "$out"
    files=$(ls tests/test_*.py tests/pallas_kernels/test_*.py | awk -v h="$half" 'NR % 2 == h % 2')
    # shellcheck disable=SC2086  # one argument per test file
    PALLAS_KERNELS_DEVICE_TESTS=gpu XLA_PYTHON_CLIENT_PREALLOCATE=false \
        step "suite$half" 560 python3 -m pytest -v -n 12 -p no:cacheprovider -rfE $files
    ;;
*)
    sed -n '2,/^# Each mode/p' "$0"
    exit 2
    ;;
esac
# The device tool brings back only a few files: the logs travel as one archive.
(cd "$out" && ls ./*.log >/dev/null 2>&1 && tar -czf logs.tar.gz ./*.log && rm -f ./*.log)
