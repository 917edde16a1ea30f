"""Generated hostile input for doctor's config reader: every override line and every YAML file either
builds a config or raises one InputError line; nothing else escapes (no traceback at the CLI)."""

import os
import string

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envbuild.errors import InputError
from envbuild.verl_config import build_config

KEYS = ["trainer.nnodes", "actor_rollout_ref.rollout.n", "data.train_files", "algorithm.adv_estimator",
        "actor_rollout_ref.actor.optim.lr", "x.y", "trainer"]
VALUE_ALPHABET = string.ascii_letters + string.digits + "[]{}(),:'\"$.=~+-_ /\\\n\t@%*?!#&|<>`^" + "\xe9\u2603"
PREFIX = st.sampled_from(["", "+", "++", "~"])
# Each example composes and resolves verl's whole config (~0.4 s): short in CI, longer on demand with
# ENVBUILD_FUZZ_EXAMPLES=500 (the run behind the counts in the report).
settings.register_profile("doctor", max_examples=int(os.environ.get("ENVBUILD_FUZZ_EXAMPLES", "25")), deadline=5000,
                          suppress_health_check=[HealthCheck.too_slow])


def outcome(config, overrides):
    try:
        build_config(config, overrides)
    except InputError as e:
        msg = str(e)
        assert "\n" not in msg.strip() or msg.count("\n") == msg.count("\\n"), msg  # one line
        return "input-error"
    return "ok"


@settings(settings.get_profile("doctor"))
@given(prefix=PREFIX, key=st.sampled_from(KEYS) | st.text(VALUE_ALPHABET, max_size=20),
       value=st.text(VALUE_ALPHABET, max_size=60) | st.sampled_from(["${oc.env:HOME}/x", "${trainer}", "[" * 200,
                                                                       "${a.b", "1e-6", "${oc.select:x,1}"]))
def test_any_override_builds_or_is_one_input_error(prefix, key, value):
    line = f"{prefix}{key}={value}" if prefix != "~" or value else f"~{key}"
    assert outcome(None, [line]) in ("ok", "input-error")


YAML_BITS = st.sampled_from(["trainer:\n", "  nnodes: 2\n", "  - a\n", "&a [x, x]\n", "b: *a\n", "x: !!set {a}\n",
                             "y: ${trainer.nnodes}\n", "z: '${oc.env:NOPE_ENVBUILD}'\n", "{{{{\n", "k: 1e-6\n",
                             "defaults:\n  - ppo_trainer\n", "? [a, b]\n: 1\n", "t: 2020-01-01\n", "n: .inf\n",
                             "<<: {a: 1}\n", "- - - -\n", "\t\n", "\"unterminated\n", "q: [1, {a: [2]}]\n"])


@settings(settings.get_profile("doctor"))
@given(bits=st.lists(YAML_BITS | st.text(VALUE_ALPHABET, max_size=30), max_size=12))
def test_any_yaml_file_builds_or_is_one_input_error(tmp_path_factory, bits):
    f = tmp_path_factory.mktemp("fz") / "cfg.yaml"
    f.write_text("".join(bits))
    assert outcome(str(f), []) in ("ok", "input-error")
