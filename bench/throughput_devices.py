"""What a throughput run's summary.json does not say about its devices: how long each device took
per request and how much of the window it was busy (from the run's requests.csv), and which
other processes held the GPUs while it ran. A device that served fewer requests than the others
either ran slower (a longer service time) or waited for work (a lower busy fraction); a process
that is not the server's can make either happen, and its run's numbers mean nothing."""
import csv
import statistics
import subprocess


def device_service(requests_csv, window_seconds):
    """Per device, over the measured requests that succeeded: their number, the median and mean
    service time (the server's total minus its queue: encode, denoise, decode and PNG), and the
    busy fraction (the sum of service times over the window; a batch's time counts once, split
    over its requests). {} when the file has no such request."""
    times = {}
    with open(requests_csv, newline="") as f:
        for row in csv.DictReader(f):
            if row["warmup"] == "1" or row["status"] != "OK" or not row["device"]:
                continue
            service = float(row["server_total_s"]) - float(row["queue_s"])
            batch = max(int(row["batch_size"] or 1), 1)
            times.setdefault(row["device"], []).append((service, batch))
    result = {}
    for device, rows in sorted(times.items()):
        services = [s for s, _ in rows]
        result[device] = {
            "requests": len(rows),
            "service_p50_seconds": statistics.median(services),
            "service_mean_seconds": statistics.fmean(services),
            "busy_fraction": (sum(s / b for s, b in rows) / window_seconds
                              if window_seconds > 0 else None)}
    return result


def parse_compute_apps(text):
    """nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader,nounits
    output as [{"pid", "name", "used_mib"}] (a process on several GPUs is listed once per GPU)."""
    processes = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 3 or not fields[0].isdigit():
            continue
        used = fields[2]
        processes.append({"pid": int(fields[0]), "name": fields[1],
                          "used_mib": int(used) if used.isdigit() else None})
    return processes


def gpu_processes():
    """The processes on the machine's NVIDIA GPUs, or None where nvidia-smi cannot say."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory",
             "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_compute_apps(out.stdout) if out.returncode == 0 else None


def other_processes(processes, own_pids, require=None):
    """The processes of `processes` whose pid is not one of `own_pids`, each listed once; none
    when `require` (a pid that must hold a GPU, such as the server's) is not listed, since then
    the ids are another namespace's."""
    if require is not None and require not in {p["pid"] for p in processes or []}:
        return []
    seen, others = set(), []
    for p in processes or []:
        if p["pid"] not in own_pids and p["pid"] not in seen:
            seen.add(p["pid"])
            others.append(p)
    return others
