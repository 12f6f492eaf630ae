"""The [cluster] example profile and the server's cluster environment, without a host."""
from hostlab import REPO
from tasks.fleet.ray_cluster import server_profile
from tasks.profile import load_profile


def test_two_node_example_and_the_servers_cluster_env():
    p = load_profile(REPO / "configs" / "qwen3.6-27b-2node.toml", environ={})
    assert p.cluster.workers == ("root@gpu-box-2",) and p.gpu_count == 2
    assert p.server.flags.value("tensor-parallel-size") * p.server.flags.value("pipeline_parallel_size") == 2 * 2
    env = dict(server_profile(p, "10.0.0.1").server.env)
    assert env["VLLM_HOST_IP"] == "10.0.0.1" and env["RAY_ADDRESS"] == "10.0.0.1:6379"
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1" and "VLLM_HOST_IP" not in p.plain_env()


def test_a_server_port_among_rays_worker_ports_is_warned(tmp_path):
    """CI once saw a Ray head's server port 18510 answer in HTTP/2 before the server bound it:
    `ray start` gives its workers ports 10002-19999 unless told otherwise (ray scripts.py)."""
    from tasks.profile import load_profile
    from tasks.steps.preflight import ray_port_checks

    def warn(port, cluster=True):
        lines = ["[target]", 'hosts = ["h1"]', "[server]", 'engine = "vllm"', 'model = "/m"',
                 f"port = {port}"]
        lines += ["[cluster]", 'backend = "ray"', 'workers = ["h2"]'] if cluster else []
        path = tmp_path / f"ray-{port}-{cluster}.toml"
        path.write_text("\n".join(lines) + "\n")
        return [(c["status"], c["check"], c["message"]) for c in ray_port_checks(load_profile(path))]
    ((status, check, message),) = warn(18510)
    assert (status, check) == ("WARN", "port") and message.startswith(
        "[server] port 18510 lies in 10002-19999, the ports Ray gives its worker processes")
    assert warn(10002) and warn(19999)
    assert warn(8000) == [] and warn(28510) == [] and warn(10001) == [] and warn(20000) == []
    assert warn(18510, cluster=False) == []
