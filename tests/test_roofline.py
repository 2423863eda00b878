"""D-cut's start profile on a GPU (rollout_graft.dcut.roofline, rollout_graft.vllm.profile): which
GPUs have a preset, the target's shape read from its config and its loaded parameters, the steps
the roofline does not model, and the proposer starting from it. Qwen3-8B is built on the meta
device (no weights); the vLLM config parts the proposer reads are given as vLLM names them."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3MoeConfig

from rollout_graft.dcut.chains import ChainDCut
from rollout_graft.dcut.roofline import ACCELERATORS, ContextProfile, Roofline, accelerator_named
from rollout_graft.vllm import profile
from rollout_graft_tools import clocks
from rollout_graft_tools.chain_replay import ours_proposer

QWEN3_8B = dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=False)


def _meta_model(config):
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16)


def _vllm_config(hf, device="cuda", tp=1, quantization=None, cache_dtype="auto"):
    return SimpleNamespace(
        device_config=SimpleNamespace(device_type=device),
        parallel_config=SimpleNamespace(tensor_parallel_size=tp, pipeline_parallel_size=1),
        model_config=SimpleNamespace(model="Qwen/Qwen3-8B", hf_text_config=hf, dtype=torch.bfloat16,
                                     quantization=quantization, max_model_len=4096, get_vocab_size=lambda: 151936),
        cache_config=SimpleNamespace(cache_dtype=cache_dtype),
        speculative_config=SimpleNamespace(num_speculative_tokens=8))


def test_gpus_named_as_cuda_names_them():
    """The SXM parts with a preset by CUDA's device names; PCIe / NVL versions (other clocks and
    bandwidths) and parts without a preset have none."""
    got = {n: (a.name if a else None) for n, a in ((n, accelerator_named(n)) for n in (
        "NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA H20", "NVIDIA H800", "NVIDIA H100 PCIe", "NVIDIA H200 NVL",
        "NVIDIA A100-SXM4-80GB", "NVIDIA GeForce RTX 4090"))}
    assert got == {"NVIDIA H200": "H200", "NVIDIA H100 80GB HBM3": "H100", "NVIDIA H20": "H20", "NVIDIA H800": "H800",
                   "NVIDIA H100 PCIe": None, "NVIDIA H200 NVL": None, "NVIDIA A100-SXM4-80GB": None,
                   "NVIDIA GeForce RTX 4090": None}
    assert {n: (a.tflops, a.tbps) for n, a in ACCELERATORS.items()} == {
        "H20": (148.0, 4.0), "H800": (989.0, 3.35), "H200": (989.0, 4.8), "H100": (989.0, 3.35)}


def test_qwen3_8b_on_an_h200_is_the_lab_preset():
    """From Qwen3-8B's published config and its parameters as built: the lab's H200/Qwen3-8B roofline
    (8.2 B parameters rounded there) within 0.5 % at every batch and draft depth."""
    config = Qwen3Config(**QWEN3_8B)
    clock, why = profile.start_profile(_vllm_config(config), _meta_model(config), device_name="NVIDIA H200")
    assert isinstance(clock, Roofline) and "H200" in why
    lab = clocks.rooflines()["H200/Qwen3-8B"]
    m = clock.model
    assert (m.layers, m.q_heads, m.kv_heads, m.head_dim, m.bytes_per_value) == (36, 32, 8, 128, 2)
    assert m.params == pytest.approx(8.19e9, rel=0.005) and m.read_bytes == 2 * m.params
    for rows, k in ((8, 0), (64, 128), (256, 2048)):
        assert float(clock.profile_ms(rows, np.array([k]), 500)[0]) == pytest.approx(
            float(lab.profile_ms(rows, np.array([k]), 500)[0]), rel=0.005)


def test_a_step_the_roofline_does_not_model_has_no_profile():
    """No profile — and the reason, for the log — on a CPU, on a GPU without a preset whose peaks
    cannot be measured (here: no CUDA), under tensor parallelism, for a mixture of experts and for
    quantized weights; an fp8 KV cache reads 1 byte a value."""
    config, moe = Qwen3Config(**QWEN3_8B), Qwen3MoeConfig(num_hidden_layers=2, num_experts=8)
    model = _meta_model(Qwen3Config(**{**QWEN3_8B, "num_hidden_layers": 2}))
    cases = {"device 'cpu'": (_vllm_config(config, device="cpu"), "NVIDIA H200"),
             "GPU 'NVIDIA A100-SXM4-80GB' has no preset and measuring its peaks failed": (_vllm_config(config),
                                                                                         "NVIDIA A100-SXM4-80GB"),
             "tensor × pipeline parallel size 2 × 1": (_vllm_config(config, tp=2), "NVIDIA H200"),
             "a mixture of experts": (_vllm_config(moe), "NVIDIA H200"),
             "quantized weights (awq)": (_vllm_config(config, quantization="awq"), "NVIDIA H200")}
    for reason, (cfg, name) in cases.items():
        clock, why = profile.start_profile(cfg, model, device_name=name)
        assert clock is None and why.startswith(reason) and "learned online" in why
    clock, _ = profile.start_profile(_vllm_config(config, cache_dtype="fp8_e4m3"), model, device_name="NVIDIA H200")
    assert clock.model.bytes_per_value == 1 and clock.model.read_bytes == 2 * clock.model.params


def test_a_gpu_without_a_preset_is_priced_by_its_measured_peaks():
    """A GPU without a preset gets the roofline of the peaks measured on it (`measure`, in the
    target's dtype), reached rather than headlined (η = 1), and the log says what was measured;
    the preset GPUs are not measured. `measure_peaks` itself, on this CPU at a small size, gives
    positive finite figures."""
    config = Qwen3Config(**QWEN3_8B)
    model = _meta_model(config)
    asked = []

    def measure(dtype):
        asked.append(dtype)
        return 312.0, 2.0

    clock, why = profile.start_profile(_vllm_config(config), model, device_name="NVIDIA A100-SXM4-80GB", measure=measure)
    assert asked == [torch.bfloat16]
    assert (clock.accelerator.tflops, clock.accelerator.tbps, clock.eta_mem, clock.eta_flop) == (312.0, 2.0, 1.0, 1.0)
    assert "measured now: 312 TFLOP/s, 2.00 TB/s" in why and "A100" in why
    # memory-bound at 8 rows: the weights' read at the measured bandwidth, plus the overhead
    assert float(clock.profile_ms(8, np.array([0]), 0)[0]) == pytest.approx(clock.overhead_ms + 1000 * 2 * 8.19e9 / 2e12, rel=0.01)
    clock, why = profile.start_profile(_vllm_config(config), model, device_name="NVIDIA H200", measure=measure)
    assert asked == [torch.bfloat16] and "datasheet" in why and clock.accelerator is ACCELERATORS["H200"]
    tflops, tbps = profile.measure_peaks("cpu", torch.float32, size=128, copy_mib=1, repeats=2)
    assert 0 < tflops < 100 and 0 < tbps < 1


def test_the_proposer_starts_dcut_from_the_roofline_at_the_running_contexts(monkeypatch):
    """`load_model` on an H200 gives D-cut the roofline's profile at the running rows' mean context
    (its KV reads grow with the rollout); on a CPU it learns online and says so in its summary."""
    config = Qwen3Config(**QWEN3_8B)
    model = _meta_model(config)
    prop = ours_proposer(8, None, 151936, 4096)
    prop.vllm_config = _vllm_config(config)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")  # no GPU here
    prop.load_model(model)
    assert isinstance(prop.policy, ChainDCut) and isinstance(prop.policy.profile, ContextProfile)
    assert "H200 roofline" in prop.summary()["start_profile"]
    clock = prop.policy.profile.clock
    for contexts in ([100, 300], [2000, 6000]):
        prop.tracker.num = np.array(contexts)
        assert prop.policy.profile(64, np.array([0, 64])) == pytest.approx(clock.profile_ms(64, np.array([0, 64]), np.mean(contexts)))
    cpu = ours_proposer(8, None, 151936, 4096)
    cpu.vllm_config = _vllm_config(config, device="cpu")
    cpu.load_model(model)
    assert cpu.policy.profile is None and cpu.summary()["start_profile"].startswith("device 'cpu'")


def test_the_running_mean_context_is_numpys_mean_bit_for_bit():
    """`ContextProfile` reads the running rows' mean context each step without `np.mean`'s per-call
    Python: the same float, so D-cut's decisions do not move (int contexts, as vLLM's, and floats)."""
    roofline = Roofline(ACCELERATORS["H200"], clocks.MODELS["Qwen3-8B"])
    rng = np.random.default_rng(0)
    for contexts in (np.array([], np.int64), rng.integers(1, 40000, 257), rng.uniform(0, 9000.5, 1024), np.array([7])):
        profile = ContextProfile(roofline, lambda c=contexts: c)
        want = roofline.profile_ms(64, np.arange(9), float(np.mean(contexts)) if len(contexts) else 0.0)
        assert profile(64, np.arange(9)).tobytes() == want.tobytes()
