"""bench/throughput_devices.py: each device's service time and busy fraction from a run's
requests.csv, and the GPU processes that are not the server's."""
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))
import throughput_bench as tb  # noqa: E402
import throughput_devices as td  # noqa: E402

HEADER = ("index,warmup,template,pipeline,scheduled_s,start_s,end_s,latency_s,first_progress_s,"
          "status,device,peer,route,batch_size,images,queue_s,server_total_s,error\n")


def row(index, device, queue, total, warmup=0, status="OK", batch=1):
    return (f"{index},{warmup},t,sd15,0,0,1,1,,{status},{device},peer,least-loaded,{batch},1,"
            f"{queue},{total},\n")


def test_service_is_the_servers_total_minus_its_queue_over_measured_successes(tmp_path):
    path = tmp_path / "requests.csv"
    path.write_text(HEADER + row(0, "cuda:0", 0.0, 9.0, warmup=1) +  # warm-up: not counted
                    row(1, "cuda:0", 0.3, 0.6) + row(2, "cuda:0", 0.1, 0.5) +
                    row(3, "cuda:1", 0.0, 0.2) +
                    row(4, "cuda:1", 0.0, 5.0, status="RESOURCE_EXHAUSTED") +
                    row(5, "cuda:1", 0.2, 1.0, batch=2) + row(6, "cuda:1", 0.2, 1.0, batch=2))
    service = td.device_service(path, window_seconds=2.0)
    assert service["cuda:0"]["requests"] == 2
    assert service["cuda:0"]["service_p50_seconds"] == pytest.approx(0.35)
    assert service["cuda:0"]["busy_fraction"] == pytest.approx(0.7 / 2.0)
    # A batch of two ran once: each of its requests counts half its time as busy.
    assert service["cuda:1"]["requests"] == 3
    assert service["cuda:1"]["service_mean_seconds"] == pytest.approx((0.2 + 0.8 + 0.8) / 3)
    assert service["cuda:1"]["busy_fraction"] == pytest.approx((0.2 + 0.4 + 0.4) / 2.0)


def test_no_measured_request_means_no_device(tmp_path):
    path = tmp_path / "requests.csv"
    path.write_text(HEADER + row(0, "cuda:0", 0, 1, warmup=1))
    assert td.device_service(path, 1.0) == {}


def test_compute_apps_parse_and_the_servers_own_are_left_out():
    text = ("4242, /opt/qpool/qpool-server, 2950\n4242, /opt/qpool/qpool-server, 2950\n"
            "77, python3, [N/A]\nnot a row\n")
    processes = td.parse_compute_apps(text)
    assert processes[0] == {"pid": 4242, "name": "/opt/qpool/qpool-server", "used_mib": 2950}
    assert processes[2] == {"pid": 77, "name": "python3", "used_mib": None}
    assert len(processes) == 3
    assert td.other_processes(processes, {4242}) == [processes[2]]
    # A process on several GPUs is one process.
    assert [p["pid"] for p in td.other_processes(processes, set())] == [4242, 77]
    assert td.other_processes(None, {1}) == []
    # Ids of another namespace (a container's nvidia-smi listing the host's): the server is not
    # among them, so nothing can be called another process.
    assert td.other_processes(processes, {5}, require=5) == []
    assert td.other_processes(processes, {4242}, require=4242) == [processes[2]]


def test_verdicts_show_each_devices_busy_fraction_and_flag_a_disturbed_run():
    summary = {"replicas": ["cuda:0", "cuda:1"], "codes": {"OK": 4},
               "device_service": {
                   "cuda:0": {"busy_fraction": 0.99, "service_p50_seconds": 0.316},
                   "cuda:1": {"busy_fraction": 0.85, "service_p50_seconds": 0.318}},
               "other_gpu_processes": [{"pid": 77, "name": "python3", "used_mib": 100}]}
    (line,) = tb.verdicts({"2gpu-c4": summary}, {})
    assert "busy cuda:0=0.99/316ms cuda:1=0.85/318ms" in line
    assert "DISTURBED by other processes on the GPUs: 77 python3" in line
