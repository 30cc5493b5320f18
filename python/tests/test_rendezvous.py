"""The data-parallel rendezvous (the c10d TCPStore at MASTER_ADDR:MASTER_PORT) does not hang and
does not listen wider than asked:

- a rank >= 1 whose MASTER_PORT is held by a program that accepts connections and never answers
  (c10d's client alone waits for its ping's answer forever) fails within --dist-timeout, with one
  error line naming the address and the timeout;
- rank 0's store listens on MASTER_ADDR (127.0.0.1 here) only, not on every interface, and a
  second rank still joins it and trains;
- a rank whose peer, and the store that peer serves, stop answering once the group is built fails
  within --dist-timeout too (c10d's store reads block for good once the store's process stops, so
  nothing after the rendezvous reads the store).

Every process is bounded by a subprocess timeout, so a regression fails instead of hanging."""
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from cli_support import BINARY, make_data_set, tiny_run_args

TIMEOUT_S = 3
# Starting the command (loading libtorch) and reading the data set come on top of the timeout;
# this machine's 2 shared cores have taken a few seconds for that.
MARGIN_S = 15


def rank_environment(rank, port):
    return {**os.environ, "WORLD_SIZE": "2", "RANK": str(rank), "LOCAL_RANK": str(rank),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}


def train_command(data_dir, output, *extra):
    return [BINARY, "train", *map(str, tiny_run_args(data_dir)), "--output", str(output), *map(str, extra)]


class SilentListener:
    """Accepts every connection on 127.0.0.1 and never sends a byte (as a hung service would)."""

    def __init__(self):
        self.server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(16)
        self.server.settimeout(0.2)
        self.port = self.server.getsockname()[1]
        self.accepted = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stopping.is_set():
            try:
                connection, _ = self.server.accept()
            except socket.timeout:
                continue
            self.accepted.append(connection)

    def close(self):
        self.stopping.set()
        self.thread.join(timeout=5)
        for connection in self.accepted:
            connection.close()
        self.server.close()


@pytest.fixture
def silent_listener():
    listener = SilentListener()
    yield listener
    listener.close()


def test_a_rank_whose_master_port_accepts_but_never_answers_fails_within_the_timeout(silent_listener, tmp_path):
    data_dir = make_data_set(tmp_path)
    started = time.monotonic()
    result = subprocess.run(train_command(data_dir, tmp_path / "runs", "--dist-timeout", TIMEOUT_S),
                            env=rank_environment(1, silent_listener.port), capture_output=True, text=True,
                            timeout=TIMEOUT_S + MARGIN_S + 30)
    elapsed = time.monotonic() - started
    assert silent_listener.accepted, "the rank never connected: this test did not exercise a silent store"
    assert result.returncode != 0, result.stderr
    assert TIMEOUT_S <= elapsed < TIMEOUT_S + MARGIN_S, f"{elapsed:.1f} s: --dist-timeout {TIMEOUT_S} was not kept"
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("convnn: error: rank 1 of 2 could not join the process group at "
                               f"127.0.0.1:{silent_listener.port} within {TIMEOUT_S} s"), result.stderr
    assert "never answered" in lines[0], result.stderr


def listening_addresses(port):
    """The local addresses of the sockets listening on TCP `port`, from /proc/net/tcp{,6}."""
    addresses = set()
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        if not os.path.exists(table):
            continue
        with open(table) as f:
            next(f)
            for line in f:
                fields = line.split()
                address, local_port = fields[1].split(":")
                if fields[3] != "0A" or int(local_port, 16) != port:  # 0A: LISTEN
                    continue
                # The kernel prints each 32-bit word of the address in host (little-endian) order.
                raw = b"".join(bytes.fromhex(address[i:i + 8])[::-1] for i in range(0, len(address), 8))
                addresses.add(socket.inet_ntop(family, raw))
    return addresses


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="reads the listening sockets from Linux's /proc")
def test_rank_0_store_listens_on_master_addr_only_and_serves_the_group(tmp_path):
    data_dir = make_data_set(tmp_path)
    port = free_port()
    common = ["--dist-timeout", 60, "--experiment", "pair"]
    rank0 = subprocess.Popen(train_command(data_dir, tmp_path / "runs", *common), env=rank_environment(0, port),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rank1 = None
    try:
        deadline = time.monotonic() + 30
        while not listening_addresses(port):  # rank 0 waits for rank 1 in the rendezvous meanwhile
            assert rank0.poll() is None, rank0.communicate()
            assert time.monotonic() < deadline, "rank 0 never listened on MASTER_PORT"
            time.sleep(0.05)
        assert listening_addresses(port) == {"127.0.0.1"}, "the store listens beyond MASTER_ADDR=127.0.0.1"
        rank1 = subprocess.Popen(train_command(data_dir, tmp_path / "runs", *common), env=rank_environment(1, port),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        outputs = [rank.communicate(timeout=120) for rank in (rank0, rank1)]
        assert [rank.returncode for rank in (rank0, rank1)] == [0, 0], outputs
        assert "2 processes (gloo" in outputs[0][0].splitlines()[0], outputs
    finally:
        for rank in (rank0, rank1):
            if rank is not None and rank.poll() is None:
                rank.kill()
                rank.communicate()


# Rank 0 of a two-process group as `convnn train` builds it (src/dist/process_group.cpp: the store
# on MASTER_PORT, the prefix "convnn/<restart count>", Gloo; it says when its store listens), which
# stops itself (SIGSTOP) mid-run: once the group is built and it has sent the length of the run's
# first shared value (run_dir), so that rank 1 has certainly finished joining, it and the store it
# serves stop answering before the value's bytes.
STOPPING_PEER = """
import datetime, os, signal, sys
import torch
import torch.distributed as dist
port, timeout = int(sys.argv[1]), datetime.timedelta(seconds=float(sys.argv[2]))
store = dist.TCPStore("127.0.0.1", port, 2, is_master=True, wait_for_workers=False, timeout=timeout)
print("listening", flush=True)
group = dist.ProcessGroupGloo(dist.PrefixStore("convnn/0", store), 0, 2, timeout)
group.broadcast([torch.tensor([4], dtype=torch.int64)]).wait()
print("joined", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
"""

# A store on MASTER_PORT whose process stops (SIGSTOP) during the rendezvous: once rank 1 has put
# its Gloo address in it, while rank 1 waits there for rank 0's.
STOPPING_STORE = """
import datetime, os, signal, sys, time
import torch.distributed as dist
port = int(sys.argv[1])
store = dist.TCPStore("127.0.0.1", port, 2, is_master=True, wait_for_workers=False,
                      timeout=datetime.timedelta(seconds=60))
print("listening", flush=True)
deadline = time.monotonic() + 60
while store.num_keys() < 1 and time.monotonic() < deadline:
    time.sleep(0.01)
print("stopping", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
"""


def rank_1_against(stopper_script, stopper_args, stopped_line, tmp_path, budget_s):
    """Rank 1 of `convnn train --dist-timeout TIMEOUT_S` against a rank 0 / store process that runs
    `stopper_script`: started once the stopper's store listens (its first line, so that the stopper's
    start-up is not charged to rank 1's timeout), it meets the stopper, which stops itself after
    printing `stopped_line`. Returns rank 1's exit status, its stderr and the seconds from the stop to
    its exit; rank 1 is killed after budget_s + 30 s."""
    data_dir = make_data_set(tmp_path)
    port = free_port()
    stopper = subprocess.Popen([sys.executable, "-c", stopper_script, str(port), *stopper_args],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert stopper.stdout.readline().strip() == "listening", stopper.communicate(timeout=5)
        rank1 = subprocess.Popen(train_command(data_dir, tmp_path / "runs", "--dist-timeout", TIMEOUT_S),
                                 env=rank_environment(1, port), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True)
        try:
            assert stopper.stdout.readline().strip() == stopped_line, stopper.communicate(timeout=5)
            stopped = time.monotonic()
            _, stderr = rank1.communicate(timeout=budget_s + 30)
        finally:
            if rank1.poll() is None:
                rank1.kill()
                rank1.communicate()
        return rank1.returncode, stderr, time.monotonic() - stopped
    finally:
        stopper.kill()  # SIGKILL ends a stopped process too
        stopper.communicate()


def test_a_rank_whose_peer_and_its_store_stop_answering_after_the_rendezvous_fails_within_the_timeout(tmp_path):
    budget = TIMEOUT_S + MARGIN_S
    status, stderr, elapsed = rank_1_against(STOPPING_PEER, ["60"], "joined", tmp_path, budget)
    assert status != 0, stderr
    assert elapsed < budget, f"{elapsed:.1f} s: --dist-timeout {TIMEOUT_S} was not kept"
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("convnn: error: rank 1 of 2: sharing 'run_dir' failed: "), stderr
    assert lines[0].endswith("did not answer within --dist-timeout)"), stderr


def test_a_rank_whose_store_stops_during_the_rendezvous_fails_within_twice_the_timeout(tmp_path):
    """c10d's store client waits for an answer with no time limit once its poll timed out; convnn
    bounds its socket's receives by --dist-timeout (src/dist/store_socket.h), so the wait fails
    after the poll's timeout and the receive's: at most twice --dist-timeout."""
    budget = 2 * TIMEOUT_S + MARGIN_S
    status, stderr, elapsed = rank_1_against(STOPPING_STORE, [], "stopping", tmp_path, budget)
    assert status != 0, stderr
    assert elapsed < budget, f"{elapsed:.1f} s: --dist-timeout {TIMEOUT_S} was not kept"
    # One line: c10d's warnings (with a C++ backtrace) are off during the join.
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("convnn: error: rank 1 of 2 could not join the process group at 127.0.0.1:"), stderr
    assert f"within {TIMEOUT_S} s (--dist-timeout)" in lines[0], stderr
