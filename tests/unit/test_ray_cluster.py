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
