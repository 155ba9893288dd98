from rapid.bench import netem


def test_netem_args_per_profile():
    assert netem.netem_args(netem.get_profile("lan")) == ["netem", "delay", "1ms"]
    assert netem.netem_args(netem.get_profile("wan")) == ["netem", "delay", "15ms", "2.5ms", "distribution",
                                                          "normal"]
    cell = netem.netem_args(netem.get_profile("cellular"))
    assert cell[:3] == ["netem", "delay", "30ms"] and cell[-2:] == ["rate", "10mbit"]


def test_setup_and_teardown_commands_are_strings_only():
    plan = netem.NetnsPlan(ns="ns1", host_if="h0", ns_if="n0", host_ip="10.9.0.1", ns_ip="10.9.0.2")
    cmds = netem.setup_commands(netem.get_profile("wan"), plan)
    flat = [" ".join(c) for c in cmds]
    assert flat[0] == "ip netns add ns1"
    assert "ip link add h0 type veth peer name n0" in flat
    assert "ip link set n0 netns ns1" in flat
    assert "ip netns exec ns1 ip addr add 10.9.0.2/24 dev n0" in flat
    assert "tc qdisc add dev h0 root netem delay 15ms 2.5ms distribution normal" in flat
    assert "ip netns exec ns1 tc qdisc add dev n0 root netem delay 15ms 2.5ms distribution normal" in flat
    assert not any("netem" in c for c in netem.setup_commands(netem.get_profile("local"), plan))
    assert [" ".join(c) for c in netem.teardown_commands(plan)] == ["ip link del h0", "ip netns del ns1"]
    assert netem.exec_prefix(plan) == ["ip", "netns", "exec", "ns1"]


def test_profile_rtt_sampling_is_non_negative():
    import random

    rng = random.Random(0)
    p = netem.get_profile("cellular")
    xs = [p.sample_rtt_s(rng) for _ in range(2000)]
    assert min(xs) >= 0 and abs(sum(xs) / len(xs) - 0.060) < 0.003
