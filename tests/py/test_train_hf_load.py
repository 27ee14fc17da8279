"""`tetra train` with checkpoint.initial_load_path + initial_load_in_hf starts from
the Hugging Face weights it is given: a run initialised with seed 999 but loading
the safetensors written from a seed-5 model has the same step-1 loss, bit for bit,
as a run initialised with seed 5. A file of another model size is refused with
the tensor named."""

import ctypes
import json
import os
import subprocess
import sys
import tempfile

BUILD = os.environ.get("TETRA_BUILD", "build")
BIN = os.environ.get("TETRA_BIN", os.path.join(BUILD, "bin"))
ROOT = os.environ.get("TETRA_ROOT", os.getcwd())
lib = ctypes.CDLL(os.path.join(BUILD, "lib", "libtetra.so"))
lib.llama3_capi_create.restype = ctypes.c_void_p
lib.llama3_capi_create.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
lib.llama3_capi_init_weights.argtypes = [ctypes.c_void_p, ctypes.c_uint64]
lib.llama3_capi_save_hf.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int,
                                    ctypes.c_char_p, ctypes.c_size_t]
lib.llama3_capi_free.argtypes = [ctypes.c_void_p]

failures = 0
checks = 0


def check(ok, msg):
    global failures, checks
    print(("ok   " if ok else "FAIL ") + msg)
    checks += 1
    failures += not ok


def save_hf(flavor, seed, path):
    err = ctypes.create_string_buffer(1024)
    h = lib.llama3_capi_create(flavor.encode(), 64, err, 1024)
    assert h, err.value
    lib.llama3_capi_init_weights(h, seed)
    assert lib.llama3_capi_save_hf(h, path.encode(), b"float32", 0, err, 1024) == 0, err.value
    lib.llama3_capi_free(h)


def train(dump, *extra):
    cmd = [os.path.join(BIN, "tetra"), "train", "--job.config_file", os.path.join(ROOT, "configs/debug_model.toml"),
           "--model.flavor", "tiny", "--training.seq_len", "32", "--training.local_batch_size", "2",
           "--training.steps", "1", "--job.dump_folder", dump, *extra]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    loss = None
    if p.returncode == 0:
        with open(os.path.join(dump, "metrics.jsonl")) as f:
            loss = json.loads(f.readline())["loss"]
    return p.returncode, loss, p.stderr


with tempfile.TemporaryDirectory() as tmp:
    hf = os.path.join(tmp, "model.safetensors")
    save_hf("tiny", 5, hf)
    rc_a, loss_a, err_a = train(os.path.join(tmp, "a"), "--training.seed", "999", "--checkpoint.initial_load_path",
                                hf, "--checkpoint.initial_load_in_hf")
    rc_b, loss_b, _ = train(os.path.join(tmp, "b"), "--training.seed", "5")
    rc_c, loss_c, _ = train(os.path.join(tmp, "c"), "--training.seed", "999")
    check(rc_a == 0 and rc_b == 0 and rc_c == 0, f"runs finish (exit codes {rc_a}, {rc_b}, {rc_c}) {err_a[-300:]}")
    check(loss_a is not None and loss_a == loss_b,
          f"loaded HF weights give the seed-5 run's step-1 loss bit for bit ({loss_a!r} vs {loss_b!r})")
    check(loss_c != loss_b, f"a seed-999 run without the file differs ({loss_c!r})")

    other = os.path.join(tmp, "debug.safetensors")
    save_hf("debugmodel", 5, other)
    rc_d, _, err_d = train(os.path.join(tmp, "d"), "--checkpoint.initial_load_path", other,
                           "--checkpoint.initial_load_in_hf")
    check(rc_d != 0 and "tensor '" in err_d and "expected [" in err_d and "debug.safetensors" in err_d,
          f"another model's file is refused naming tensor and file: {err_d.strip().splitlines()[-1] if err_d else ''}")

print(f"{checks - failures} passed, {failures} failed")
sys.exit(1 if failures else 0)
