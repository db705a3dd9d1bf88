"""Digests of runs on the overlapped host link (``models/simulator.md`` (26)-(31): copies
queued in each link order, swap-outs freeing their blocks at the copy's end, swap-ins
taking them at its start, proactive swapping, host memory too small for some victims),
pinned from the object replica engine the simulator had before its replicas were
compiled. The replicas must give the same digests, in the fast and the reference mode."""
from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest

import lpserve as lp

ORDERS = ("fifo", "priority", "llf", "rmlq")


def host_link_instance(seed: int) -> lp.Instance:
    """40 requests in bursts on a tight Llama-2-7B pool (one replica for even seeds, two
    for odd), an SLO (the deadlines of ``llf`` and ``rmlq``) and host memory of 64 GB
    (seeds 0, 1) or 0.25 GB (2, 3: some victims find no room and recompute)."""
    rng = np.random.default_rng(seed)
    n = 40
    arrival = np.sort(np.concatenate([rng.uniform(0, 0.3, n // 2),
                                      rng.uniform(1.0, 1.5, n - n // 2)]))
    tr = lp.Trace.from_arrays(arrival_s=arrival, prompt_tokens=rng.integers(200, 900, n),
                              output_tokens=rng.integers(20, 200, n))
    return lp.Instance(trace=tr, cluster=lp.Cluster(
        gpu="a100-80gb", llm="llama-2-7b", replicas=1 + seed % 2, gpu_memory_fraction=0.171,
        host_memory_gb=64.0 if seed < 2 else 0.25), slo=lp.SLO(ttft_s=1.0, tpot_s=0.05))


def host_link_policy(name: str, order: str, preemption: str, proactive: bool) -> lp.Policy:
    """``name`` on the overlapped host link with ``order``, ``preemption`` and, when
    ``proactive``, FastServe's proactive swapping."""
    return lp.make_policy(name, transfers="overlap", link_order=order, preemption=preemption,
                          proactive_swap=proactive)


CASES = [(seed, name, order, pre, pro) for seed in range(4) for name in ("fastserve", "las")
         for order in ORDERS for pre in ("swap", "compress-swap") for pro in (True, False)
         if (seed + ORDERS.index(order) + (pre == "swap") + pro) % 2 == 0]

# Result.digest() of each case on the object replicas of that time (fast and reference
# mode equal)
PINNED: dict[tuple, str] = {
    (0, 'fastserve', 'fifo', 'swap', True):
        '3fa750c2582659f05612bb85334c52d35d39782496ec5c36c9e9ff6f191f30d7',
    (0, 'fastserve', 'fifo', 'compress-swap', False):
        'a268fe4a9a976f530e7f1d9f8fc8b9be053e6575412ba38959ec09f7e3826cc4',
    (0, 'fastserve', 'priority', 'swap', False):
        '8c260849f4e91151a292e50c393dd99b45a7a4dec3b6766e5d257f1ff2683ae4',
    (0, 'fastserve', 'priority', 'compress-swap', True):
        'a5c27566f4f6d4dacf1e7b9da49c84345262ba7947004b7714499989395c5495',
    (0, 'fastserve', 'llf', 'swap', True):
        'f6ab051d99a60fe3ebb6f1595700be5ad824e6f8d53854b0494dfadc8d5491fe',
    (0, 'fastserve', 'llf', 'compress-swap', False):
        '0a8f30f1bb682c6eef61e88863fd601c2a8935cef852ec9c21dc867ecf3cc239',
    (0, 'fastserve', 'rmlq', 'swap', False):
        'f5a25073425719f309597af9ed32ee3bdc48c90d49c4fb473207442e294f07a1',
    (0, 'fastserve', 'rmlq', 'compress-swap', True):
        '83e1808685cf261e3b1cd4069e852edc77af7e674a32fee903eadbee711c402b',
    (0, 'las', 'fifo', 'swap', True):
        '2be0a989ce1499211df23d08bd5b5b9cf723535869ae6ec5d9f5e2a0e68617fb',
    (0, 'las', 'fifo', 'compress-swap', False):
        '8421f10fdb5d3953cae1f5623309c25887090daff8b71dd23cc49591bd50c8ff',
    (0, 'las', 'priority', 'swap', False):
        '7d9195586e3eeb7ddaad5281a3722a6764e1e9855957851473903613d43847cb',
    (0, 'las', 'priority', 'compress-swap', True):
        'c4cb037e3ac699333416e2c61fb485133157cb1880805fcf91200a03be462068',
    (0, 'las', 'llf', 'swap', True):
        '928139807a7c5b831771a0ef26e5474da4a9fd34f000bbd7c8dd11f8d3e5815f',
    (0, 'las', 'llf', 'compress-swap', False):
        'e57fc2c4ab169781de0302805b8dbd00614214a9e248397863deef8f2ca16934',
    (0, 'las', 'rmlq', 'swap', False):
        '8bc724e7fdf79734699f942b17b336fe047cc192660b7219dc344268f03d7f8b',
    (0, 'las', 'rmlq', 'compress-swap', True):
        '4341268ad8d8c2c44714637753e7cccfa3c5f308bc7e23d435ed6b809607a761',
    (1, 'fastserve', 'fifo', 'swap', False):
        '95ff35c8867798ff16ca70ca2a4e5124454a48185e6c61a336e11f943bc5d66c',
    (1, 'fastserve', 'fifo', 'compress-swap', True):
        '7832264c5ed0453f04924b866ebca4e2d928c81832b7288a2013d23fee93d193',
    (1, 'fastserve', 'priority', 'swap', True):
        'b943c93478021f5bed97dca01f2ee1ebbc83f4bcf5b6b6a63242b2195397a760',
    (1, 'fastserve', 'priority', 'compress-swap', False):
        '7832264c5ed0453f04924b866ebca4e2d928c81832b7288a2013d23fee93d193',
    (1, 'fastserve', 'llf', 'swap', False):
        '5c4cd865bd361d51eb89b3967941db26bff5e13d752a07a3c1e4a9e33ba80286',
    (1, 'fastserve', 'llf', 'compress-swap', True):
        '7e5d476cec582c38efeac347cabde83542e0fe1c30cc05d4320ff5cf9126cf1b',
    (1, 'fastserve', 'rmlq', 'swap', True):
        'b943c93478021f5bed97dca01f2ee1ebbc83f4bcf5b6b6a63242b2195397a760',
    (1, 'fastserve', 'rmlq', 'compress-swap', False):
        '7832264c5ed0453f04924b866ebca4e2d928c81832b7288a2013d23fee93d193',
    (1, 'las', 'fifo', 'swap', False):
        'a6664d72675fb30d7bcf291c26c8bc7925cda1cb8aadf02b668ad01b0d56d7b4',
    (1, 'las', 'fifo', 'compress-swap', True):
        '848c7b71c8d659a7edf199b484493120d43a195ccd7bdcb1295af077d0618f05',
    (1, 'las', 'priority', 'swap', True):
        '25fcfca9a953984a9cc03ccce7689536db01b2ce64719665e54e5fb438daebbb',
    (1, 'las', 'priority', 'compress-swap', False):
        'a45c18672bfd79a64752cbbbaa22835808cc8bb733c75dfe4cea7c7061f3a4c1',
    (1, 'las', 'llf', 'swap', False):
        'f9949cfb032487cd8380472f508881831f4febb5d24ff3f87b6d58d4c8a8220d',
    (1, 'las', 'llf', 'compress-swap', True):
        '04daa197c27f1e90ed6dc2003a6c560728a0924c3d04685f89ce37d226fad3ca',
    (1, 'las', 'rmlq', 'swap', True):
        '9a1df6d6e00289493d013e0bc739160853f5579c80714cc025213319d5beb450',
    (1, 'las', 'rmlq', 'compress-swap', False):
        'f02f4f554551a7d2444c12bb97762aa62f226667fc463502476afc4bf8df222c',
    (2, 'fastserve', 'fifo', 'swap', True):
        'e8e42dacb4dad5c262b2d7f601e06a58a6ba970ae96e9bd567c16d9923be6bf3',
    (2, 'fastserve', 'fifo', 'compress-swap', False):
        '721bf577779a6348e44a433ba082023656e11d504e1a102f0132cbbbac80f3d2',
    (2, 'fastserve', 'priority', 'swap', False):
        '624e97e636cb04d354726057ab4f6373de039c639b6f25def2b16e73133db862',
    (2, 'fastserve', 'priority', 'compress-swap', True):
        '4cac4388fb6b4ab1d36afb09d67b79009dc11fd023045e2018096f3bc845a75b',
    (2, 'fastserve', 'llf', 'swap', True):
        'e8e42dacb4dad5c262b2d7f601e06a58a6ba970ae96e9bd567c16d9923be6bf3',
    (2, 'fastserve', 'llf', 'compress-swap', False):
        '151dedc72b860a090d3c9c16eda20dd5a66194692a1ab5692ef6e1d46d7671f6',
    (2, 'fastserve', 'rmlq', 'swap', False):
        '624e97e636cb04d354726057ab4f6373de039c639b6f25def2b16e73133db862',
    (2, 'fastserve', 'rmlq', 'compress-swap', True):
        '4cac4388fb6b4ab1d36afb09d67b79009dc11fd023045e2018096f3bc845a75b',
    (2, 'las', 'fifo', 'swap', True):
        '2bbde0a655170a91687fef2b9bbf49f30e2171d48f5d085606b5d1802dfdab13',
    (2, 'las', 'fifo', 'compress-swap', False):
        'ee9b3c04f2ebc87648822975c21a1792618f759999e744622f0a8ffdfab19922',
    (2, 'las', 'priority', 'swap', False):
        '680826a657562206257da3e5033e714a25d2c421f442855b7635a0b9ba4924f1',
    (2, 'las', 'priority', 'compress-swap', True):
        'a7c26e977c4b91704573f52ad83448a1ce4559f699680b062ec8b4f3e4c9fd42',
    (2, 'las', 'llf', 'swap', True):
        '2bbde0a655170a91687fef2b9bbf49f30e2171d48f5d085606b5d1802dfdab13',
    (2, 'las', 'llf', 'compress-swap', False):
        'ee9b3c04f2ebc87648822975c21a1792618f759999e744622f0a8ffdfab19922',
    (2, 'las', 'rmlq', 'swap', False):
        '680826a657562206257da3e5033e714a25d2c421f442855b7635a0b9ba4924f1',
    (2, 'las', 'rmlq', 'compress-swap', True):
        'a7c26e977c4b91704573f52ad83448a1ce4559f699680b062ec8b4f3e4c9fd42',
    (3, 'fastserve', 'fifo', 'swap', False):
        '12e23fe0cdeb88a64cf8150dc338c05cb5dbdeeaeac79e4a9e8f46f711c37825',
    (3, 'fastserve', 'fifo', 'compress-swap', True):
        '33235bd4cc5824e27c65852ac64b3ff3a2ad87b4eab64731fb6167524ca7b4e5',
    (3, 'fastserve', 'priority', 'swap', True):
        '27b89b682b264bb5362a346c7f429b905389534ab871df5b9e916b777c896d4d',
    (3, 'fastserve', 'priority', 'compress-swap', False):
        'f5f9794d862c8fbb75b1e2fa720c40004f6f231b570a564616e818e4704074bb',
    (3, 'fastserve', 'llf', 'swap', False):
        '12e23fe0cdeb88a64cf8150dc338c05cb5dbdeeaeac79e4a9e8f46f711c37825',
    (3, 'fastserve', 'llf', 'compress-swap', True):
        '33235bd4cc5824e27c65852ac64b3ff3a2ad87b4eab64731fb6167524ca7b4e5',
    (3, 'fastserve', 'rmlq', 'swap', True):
        '27b89b682b264bb5362a346c7f429b905389534ab871df5b9e916b777c896d4d',
    (3, 'fastserve', 'rmlq', 'compress-swap', False):
        'f5f9794d862c8fbb75b1e2fa720c40004f6f231b570a564616e818e4704074bb',
    (3, 'las', 'fifo', 'swap', False):
        '9766aa84827b4c36d7826387479e1be480f9180df9fa54cc686a6a2e5b4b61c5',
    (3, 'las', 'fifo', 'compress-swap', True):
        '315a185bae60fc7908cb6884400b2938e6b082d13c92e696bc5e0bc4e7e502c9',
    (3, 'las', 'priority', 'swap', True):
        '26318fa0d8352b942883c54bb59544ff9344b1b049dbf880f4e2c1fdaf382894',
    (3, 'las', 'priority', 'compress-swap', False):
        'ce339ca8495a3cacdd79dbd6cf2a989d5d898950daafd0068ed41dc3b9c67ec9',
    (3, 'las', 'llf', 'swap', False):
        '9766aa84827b4c36d7826387479e1be480f9180df9fa54cc686a6a2e5b4b61c5',
    (3, 'las', 'llf', 'compress-swap', True):
        '315a185bae60fc7908cb6884400b2938e6b082d13c92e696bc5e0bc4e7e502c9',
    (3, 'las', 'rmlq', 'swap', True):
        '26318fa0d8352b942883c54bb59544ff9344b1b049dbf880f4e2c1fdaf382894',
    (3, 'las', 'rmlq', 'compress-swap', False):
        'ce339ca8495a3cacdd79dbd6cf2a989d5d898950daafd0068ed41dc3b9c67ec9',
}


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_host_link_runs_keep_their_pinned_digests(case):
    seed, name, order, pre, pro = case
    inst = host_link_instance(seed)
    pol = host_link_policy(name, order, pre, pro)
    fast = lp.simulate(inst, pol, seed=0)
    assert fast.stats["engine"] == "compiled"
    assert fast.digest() == PINNED[case]
    assert lp.simulate(inst, pol, seed=0, reference=True).digest() == PINNED[case]
    assert fast.stats["link_copies"] > 0


@pytest.mark.parametrize("case", CASES[::4], ids=lambda c: "-".join(map(str, c)))
def test_a_scheduler_written_in_python_keeps_the_pinned_digests(case):
    """The same runs with the scheduler written in Python (a subclass without the
    compiled twin): the compiled replicas ask it in pauses, twice in a step where a
    swapped-in request joins the batch (before the join and after it, rule (28))."""
    seed, name, order, pre, pro = case
    pol = host_link_policy(name, order, pre, pro)
    sched = copy.copy(pol.scheduler)  # the same parameters, no kernel_spec of its own
    sched.__class__ = type("InPython", (type(pol.scheduler),), {})
    r = lp.simulate(host_link_instance(seed), dataclasses.replace(pol, scheduler=sched),
                    seed=0, check=True)
    assert r.stats["engine"] == "compiled+python-ranks"
    assert r.digest() == PINNED[case]


@pytest.mark.parametrize("proactive", [False, True])
def test_swap_ins_can_take_the_decodes_blocks(proactive):
    """Named example, the livelock that rule (28) (``models/simulator.md``) ends: ``las``
    on the ``llf`` link. When a swap-in counted only its own blocks, from 8.6 s on a
    swap-in took the blocks a swap-out had just freed, a running decode then lacked a
    block, memory pressure preempted the newcomer, whose swap-out freed the blocks the
    other swapped request took in turn: two requests swapped in and out and no iteration
    ran again (7 of 40 requests finished by a 60 s horizon; without one the run never
    ended). A swap-in is now admitted only when the running decodes keep the blocks their
    next tokens need (as vLLM swaps in after the running requests have their slots): all
    40 finish, by 18.3 s."""
    inst = host_link_instance(0).with_(horizon_s=60.0)
    for reference in (False, True):
        r = lp.simulate(inst, host_link_policy("las", "llf", "swap", proactive), seed=0,
                        reference=reference)
        assert r.summary()["n_finished"] == 40
