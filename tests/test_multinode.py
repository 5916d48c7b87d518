"""Two machines on one host: two launcher processes with num_machines=2 and machine_rank 0 and 1 meet
through main_process_ip:main_process_port (the static rendezvous), one DDP rank each, and end on the
same weights as one process with the whole batch."""
import socket
import subprocess
import sys

from tests.distributed import assert_same_weights, final_weights, reference

MACHINE = """
import sys
from giga_train import launch_from_config
from tests.distributed import job
project, rank, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
cfg = job(project, "DDP", ranks=2, launch=dict(num_machines=2, machine_rank=rank, main_process_ip="127.0.0.1",
                                               main_process_port=port))
cfg["launch"]["num_processes"] = 1  # per machine: 2 ranks in all, batch 4 each
launch_from_config(cfg)
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_machines_equal_one_process(tmp_path, tmp_path_factory):
    port = free_port()
    machines = [subprocess.Popen([sys.executable, "-c", MACHINE, str(tmp_path), str(rank), str(port)],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in (0, 1)]
    outputs = [m.communicate(timeout=180)[0] for m in machines]
    assert [m.returncode for m in machines] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    assert_same_weights(final_weights(tmp_path), reference(tmp_path_factory, {}))
