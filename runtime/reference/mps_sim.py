"""What an MPS server does to its clients, imitated by the reference backend on CPU (device cpu only).

A CPU process cannot be an MPS client, but the runtime's fault containment must be tested on loopback against
processes that fail the way MPS clients do (NVIDIA MPS documentation, docs.nvidia.com/deploy/mps, "Memory
Protection and Error Containment", and the Troubleshooting Guide, "MPS Server Not Accepting New Client Requests"):

- a fatal GPU exception in one client is reported to every client of that GPU's server: here the faulting process
  records the fault in the daemon's pipe directory and dies, and every other client that reads it stops answering
  while staying alive (what the H200 showed: one process died, its neighbour never answered again);
- the server then refuses new clients (cudaErrorMpsServerNotReady, 807) until every client of the fault has
  exited, and recreates its context once they have: here a process that starts while a fault's clients live exits
  with that error, and the first to start after them clears the fault.

Active only where CUDA_MPS_PIPE_DIRECTORY names the pipe directory of a live control daemon (the runtime sets it
for a pool with `gpu_sharing: mps`); without a daemon a CUDA program runs without MPS ("Appendix: Tools and
Interface Reference", nvidia-cuda-mps-control), and so does this imitation. On cuda the real MPS does all of it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from ..mps import process_alive

# The daemon's own PID file, and where the imitation keeps its state next to it (runtime/mps.py: the pipe directory).
PID_FILE = "nvidia-cuda-mps-control.pid"
FAULT_FILE = "fleetcast-reference-fault.json"
CLIENTS_DIR = "fleetcast-reference-clients"
SERVER_NOT_READY = "cudaErrorMpsServerNotReady (807): the MPS server is not ready to accept new MPS client requests"


class MpsServerNotReady(RuntimeError):
    pass


class MpsClientSim:
    def __init__(self, pipe_dir: Path, pid: int | None = None):
        self.pipe_dir = pipe_dir
        self.pid = os.getpid() if pid is None else pid

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> MpsClientSim | None:
        """The imitation for this process, or None where no control daemon runs at CUDA_MPS_PIPE_DIRECTORY."""
        pipe = environ.get("CUDA_MPS_PIPE_DIRECTORY")
        if not pipe:
            return None
        try:
            daemon = int((Path(pipe) / PID_FILE).read_text().strip())
        except (OSError, ValueError):
            return None
        return cls(Path(pipe)) if process_alive(daemon) else None

    def _fault_pids(self) -> list[int] | None:
        try:
            return [int(p) for p in json.loads((self.pipe_dir / FAULT_FILE).read_text())["clients"]]
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def connect(self) -> None:
        """A client's first CUDA call: refused while any client of a fault lives; the fault is cleared (the server
        recreates its context) once none does. Then this process counts as a client."""
        pids = self._fault_pids()
        if pids is not None:
            living = [p for p in pids if p != self.pid and process_alive(p)]
            if living:
                raise MpsServerNotReady(f"{SERVER_NOT_READY} (clients of the last fault still running: "
                                        f"{', '.join(map(str, living))})")
            (self.pipe_dir / FAULT_FILE).unlink(missing_ok=True)
        clients = self.pipe_dir / CLIENTS_DIR
        clients.mkdir(parents=True, exist_ok=True)
        (clients / str(self.pid)).touch()

    def clients(self) -> list[int]:
        out = []
        for entry in (self.pipe_dir / CLIENTS_DIR).glob("*"):
            if entry.name.isdigit() and process_alive(int(entry.name)):
                out.append(int(entry.name))
            else:
                entry.unlink(missing_ok=True)
        return sorted(out)

    def fault(self) -> None:
        """This client faults: every live client of the server learns of it (the caller then dies)."""
        tmp = self.pipe_dir / f".{FAULT_FILE}.{self.pid}"
        tmp.write_text(json.dumps({"faulted": self.pid, "clients": sorted(set(self.clients()) | {self.pid})}))
        tmp.replace(self.pipe_dir / FAULT_FILE)

    def reported(self) -> bool:
        """A fault of another client was reported to this one."""
        pids = self._fault_pids()
        return pids is not None and self.pid in pids
