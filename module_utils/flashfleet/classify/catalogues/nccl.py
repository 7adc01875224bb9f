"""NCCL's own failures: its result codes (ncclResult_t) as torch raises them, and the warnings of its
transports and setup that name the cause behind them (the `Last error:` torch appends, the `NCCL
WARN` lines of NCCL_DEBUG=WARN), and torch's watchdog for collectives that never finish.

Sources: nccl.h (src/nccl.h.in: ncclResult_t, ncclSuccess..ncclTimeout) and ncclGetErrorString
(src/init.cc), NCCL 2.18-2.29; the WARN formats of src/transport/net_ib (completions with error,
async events), src/misc/socket.cc / src/os/linux.cc (sockets), src/misc/ibvwrap.cc (verbs calls),
src/transport/nvls.cc (NVLink SHARP), src/misc/shmutils.cc / src/os/linux.cc (shared memory),
src/include/alloc.h, src/bootstrap.cc, src/init.cc; the ibv_wc_status values of libibverbs'
verbs.h; torch's ProcessGroupNCCL (c10d: `NCCL error in: <file>:<line>, <message>, NCCL version
<v>`, getNcclErrorDetailStr, the watchdog and heartbeat monitor).

NCCL prints its WARN lines as `<host>:<pid>:<tid> [<cuda dev>] <file>:<line> NCCL WARN <text>`.
Network failures act check-network; one rank's failure shows on the others as ncclRemoteError or a
closed connection, so the rank that went first (diagnose every host) is the cause."""

from __future__ import annotations

import re

from .entry import Entry

SOURCE = "NCCL, nccl.h ncclResult_t and ncclGetErrorString (src/init.cc), NCCL 2.18-2.29"
NET_SOURCE = "NCCL transport warnings (src/transport/net_ib, src/misc/socket.cc, src/os/linux.cc), NCCL 2.18-2.29"
TORCH_SOURCE = "PyTorch c10d ProcessGroupNCCL (NCCLUtils.hpp, ProcessGroupNCCL.cpp), torch 2.x"

_WHERE = "node1:48213:48790 [3]"  # NCCL's prefix: host, pid, thread and CUDA device of the rank
_TORCH = ("torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/"
          "ProcessGroupNCCL.cpp:1970, {}, NCCL version 2.21.5")


def _result(name: str, number: int, message: str, verdict: str, action: str, meaning: str,
            pattern: str | None = None) -> Entry:
    spelled = pattern or re.escape(message)
    # torch's line prints the message, not the code's name: the message is the fact to quote
    return Entry("nccl", name, re.compile(rf"\b{name}\b|NCCL error(?: in: \S+,|:) {spelled}"),
                 f"{name} ({message}): {meaning}", verdict, action, SOURCE, _TORCH.format(message), number=number,
                 key=message)


def _warn(name: str, pattern: str, meaning: str, verdict: str, action: str, source: str, text: str,
          file: str, **extra) -> Entry:
    sample = f"{_WHERE} {file} NCCL WARN {text}"
    return Entry("nccl", name, re.compile(pattern), meaning, verdict, action, source, sample,
                 key=_fact(pattern, sample), extra=extra)


def _torch(name: str, pattern: str, meaning: str, verdict: str, action: str, sample: str) -> Entry:
    return Entry("nccl", name, re.compile(pattern), meaning, verdict, action, TORCH_SOURCE, sample,
                 key=_fact(pattern, sample))


def _fact(pattern: str, sample: str) -> str:
    """The words of the line that identify it (what its pattern finds): the fact a verdict quotes."""
    m = re.search(pattern, sample)
    return m.group(0).strip() if m else ""


# IB work-completion statuses (enum ibv_wc_status) NCCL prints as `status=12` (2.19+), `error 12`
# (up to 2.18) or `status=IBV_WC_RETRY_EXC_ERR(12)` (2.28+).
_IB_SPECIFIC = (4, 5, 10, 12, 13)


def _ib_status(n: int) -> str:
    return rf"Got completion from peer \S+ with (?:error |status=(?:IBV_WC_\w+\()?){n}\b"


_IB_SAMPLE = ("NET/IB : Got completion from peer 10.18.0.12<47530> with status={} opcode=0 len=0 vendor err {} "
              "(Recv) localGid ::ffff:10.18.0.11 remoteGids::ffff:10.18.0.12 hca mlx5_0")

ENTRIES = (
    # --- ncclResult_t, as torch's DistBackendError line prints it (the next line names the code)
    _result("ncclUnhandledCudaError", 1, "unhandled cuda error (run with NCCL_DEBUG=INFO for details)", "nccl-error",
            "investigate", "a CUDA call inside NCCL failed; its `Last error:` names it (`Cuda failure 'out of memory'` "
            "is GPU memory, an illegal access or a Xid is the GPU's)"),
    _result("ncclSystemError", 2, "unhandled system error (run with NCCL_DEBUG=INFO for details)", "nccl-error",
            "investigate", "a system or library call inside NCCL failed (a socket, shared memory, malloc, verbs); its "
            "`Last error:` names which, and a peer that exited shows this way on older NCCL"),
    _result("ncclInternalError", 3, "internal error - please report this issue to the NCCL developers", "nccl-error",
            "investigate", "NCCL's own consistency check failed, often after an earlier failure; read its WARN lines"),
    _result("ncclInvalidArgument", 4, "invalid argument (run with NCCL_DEBUG=WARN for details)", "nccl-error",
            "investigate", "the program passed NCCL an invalid argument (a bad pointer, count or dtype): a bug in the "
            "program or the library calling NCCL"),
    _result("ncclInvalidUsage", 5, "invalid usage (run with NCCL_DEBUG=WARN for details)", "nccl-error",
            "investigate", "NCCL was used wrongly (two ranks on one GPU, mismatched collectives across ranks, a "
            "communicator used after an abort); its WARN line says which"),
    # The code alone cannot tell a peer that died from a network that failed: its `Last error:` can
    # (the nccl_error rule reads it), so the code's own action is to look.
    _result("ncclRemoteError", 6, "remote process exited or there was a network error", "nccl-error",
            "investigate", "a peer rank went away or the network between the nodes failed: find the rank that "
            "died first (diagnose every host), else check the links (IB/RoCE, sockets)"),
    _result("ncclInProgress", 7, "NCCL operation in progress", "nccl-error", "investigate",
            "a non-blocking NCCL call had not finished when its result was used"),
    _result("ncclTimeout", 8, "timeout", "nccl-timeout", "rerun",
            "an NCCL operation ran past its timeout (NCCL 2.29+): a peer that hung or died, or a stalled network",
            pattern=r"timeout\b(?! [a-z])"),

    # --- InfiniBand / RoCE completions with error: the link or the peer failed mid-transfer
    Entry("nccl", "IBV_WC_RETRY_EXC_ERR", re.compile(_ib_status(12)),
          "an IB/RoCE transfer gave up after its retries (IBV_WC_RETRY_EXC_ERR, status 12): the peer's NIC stopped "
          "answering (its rank died, its link went down) or the fabric dropped packets; check the links, or raise "
          "NCCL_IB_TIMEOUT if the fabric is only slow", "nccl-error", "check-network", NET_SOURCE,
          f"{_WHERE} transport/net_ib.cc:1909 NCCL WARN " + _IB_SAMPLE.format(12, 129), number=12, key="status=12"),
    Entry("nccl", "IBV_WC_RNR_RETRY_EXC_ERR", re.compile(_ib_status(13)),
          "an IB/RoCE send found no receive posted after all retries (IBV_WC_RNR_RETRY_EXC_ERR, status 13): the "
          "peer is stuck or gone", "nccl-error", "check-network", NET_SOURCE,
          f"{_WHERE} transport/net_ib.cc:1909 NCCL WARN " + _IB_SAMPLE.format(13, 136), number=13, key="status=13"),
    Entry("nccl", "IBV_WC_WR_FLUSH_ERR", re.compile(_ib_status(5)),
          "IB/RoCE work was flushed because its queue pair had already failed (IBV_WC_WR_FLUSH_ERR, status 5): the "
          "first error on that connection, or NICs of one host that cannot reach each other, is the cause",
          "nccl-error", "check-network", NET_SOURCE,
          f"{_WHERE} transport/net_ib.cc:1909 NCCL WARN " + _IB_SAMPLE.format(5, 249), number=5, key="status=5"),
    Entry("nccl", "IBV_WC_LOC_PROT_ERR", re.compile(_ib_status(4)),
          "the NIC was refused access to the (GPU) buffer (IBV_WC_LOC_PROT_ERR, status 4): usually PCIe ACS left "
          "enabled, which breaks GPUDirect RDMA; disable ACS, or NCCL_NET_GDR_LEVEL=0 to confirm", "nccl-error",
          "investigate", NET_SOURCE,
          f"{_WHERE} transport/net_ib.cc:1909 NCCL WARN " + _IB_SAMPLE.format(4, 81), number=4, key="status=4"),
    Entry("nccl", "IBV_WC_REM_ACCESS_ERR", re.compile(_ib_status(10)),
          "the peer's NIC refused the RDMA access (IBV_WC_REM_ACCESS_ERR, status 10): its memory registration is "
          "gone, usually because the peer rank exited", "nccl-error", "check-network", NET_SOURCE,
          f"{_WHERE} transport/net_ib.cc:1909 NCCL WARN " + _IB_SAMPLE.format(10, 136), number=10, key="status=10"),
    Entry("nccl", "ibv-completion-error",
          re.compile(r"Got completion from peer \S+ with (?:error |status=(?:IBV_WC_\w+\()?)"
                     rf"(?!(?:{'|'.join(map(str, _IB_SPECIFIC))})\b)\d+"),
          "an IB/RoCE transfer completed with an error (the status names the ibv_wc_status): the link or the peer "
          "failed mid-transfer", "nccl-error", "check-network", NET_SOURCE,
          f"{_WHERE} transport/net_ib.cc:1909 NCCL WARN " + _IB_SAMPLE.format(9, 138), key="Got completion from peer"),
    _warn("ib-async-event", r"NET/IB ?: \S+ Got (?:non-fatal )?async event ?: ",
          "the IB/RoCE adapter reported an event on its port (port error, link down, GID change): the host's link "
          "to the fabric dropped", "nccl-error", "check-network", NET_SOURCE,
          "NET/IB : mlx5_0:1 Got async event : port error", "transport/net_ib.cc:101"),
    _warn("ib-fatal-event", r"NET/IB ?: \S+ async fatal event on (?:QP|CQ|SRQ)",
          "the IB/RoCE adapter reported a fatal event on a queue (QP/CQ): the connection is dead; check the NIC and "
          "its link", "nccl-error", "check-network", NET_SOURCE,
          "NET/IB : mlx5_0:1 async fatal event on QP (0x55d0c8a0) qpn=4711 handle=3 send_cq=2 recv_cq=2 state=6 "
          "sq_psn=0 rq_psn=0: local work queue catastrophic error", "transport/net_ib/common.cc:140"),
    # QPs pin memory: the unit's locked-memory limit (LimitMEMLOCK) is the usual cause, not the network
    _warn("ibv_create_qp", r"Call to ibv_create_qp failed",
          "NCCL could not create an IB queue pair: usually the locked-memory limit (the unit's LimitMEMLOCK=, ulimit "
          "-l) is too low, else the NIC is out of QPs", "nccl-error", "fix-config", NET_SOURCE,
          "Call to ibv_create_qp failed with error Cannot allocate memory", "misc/ibvwrap.cc:202"),
    _warn("ibv_modify_qp", r"Call to ibv_modify_qp failed",
          "NCCL could not bring an IB/RoCE connection up (ibv_modify_qp): the peer's address (GID, NCCL_IB_GID_INDEX), "
          "a RoCE routing or a down link", "nccl-error", "check-network", NET_SOURCE,
          "Call to ibv_modify_qp failed with 110 Connection timed out, on dev mlx5_0:1, curr state INIT, next state "
          "RTR, local GID index 3, local GID ::ffff:10.18.0.11, remote GID ::ffff:10.18.0.12", "misc/ibvwrap.cc:376"),
    _warn("ibv_reg_mr", r"Call to ibv_reg_(?:dmabuf_)?mr\w* failed",
          "NCCL could not register a (GPU) buffer with the NIC: GPUDirect RDMA is not working (nvidia_peermem not "
          "loaded, no dma-buf support) or the locked-memory limit is too low", "nccl-error", "fix-driver", NET_SOURCE,
          "Call to ibv_reg_mr_iova2 failed with error Bad address", "misc/ibvwrap.cc:210"),

    # --- sockets (bootstrap and the socket transport)
    _warn("socket-closed", r"Connection closed by remote peer",
          "the peer closed its NCCL socket: its rank exited (find the rank that died first) or the network "
          "dropped the connection", "nccl-error", "check-network", NET_SOURCE,
          "socketProgress: Connection closed by remote peer node2<45127>", "misc/socket.cc:50"),
    _warn("socket-refused", r"[Cc]onnect to \S+ failed : Connection refused",
          "a rank could not connect to its peer: nothing listens there (the peer is not up or died) or a firewall "
          "rejects the port", "nccl-error", "check-network", NET_SOURCE,
          "socketStartConnect: Connect to 10.18.0.12<43215> failed : Connection refused", "misc/socket.cc:484"),
    _warn("socket-connect", r"[Cc]onnect to \S+ failed : (?!Connection refused)",
          "a rank could not reach its peer over TCP (no route, timed out, aborted): check routes, firewalls and "
          "NCCL_SOCKET_IFNAME", "nccl-error", "check-network", NET_SOURCE,
          "socketStartConnect: Connect to 10.18.0.12<43215> failed : No route to host", "misc/socket.cc:484"),
    _warn("no-socket-interface", r"Bootstrap ?: no socket interface found",
          "NCCL found no network interface to bootstrap on: NCCL_SOCKET_IFNAME names an interface this host lacks",
          "nccl-error", "fix-config", "NCCL bootstrap (src/bootstrap.cc)",
          "Bootstrap : no socket interface found", "bootstrap.cc:48"),

    # --- NVLink SHARP (NVLS) multicast setup: the fabric manager, IMEX or the container forbids it
    _warn("nvls-bind", r"Failed to bind NVLink SHARP \(NVLS\) Multicast memory",
          "NCCL's NVLink SHARP multicast setup failed (a fabric manager or NVSwitch problem, or a container without "
          "the privilege): disable NVLS (NCCL_NVLS_ENABLE=0) or repair the fabric manager", "nccl-error", "fix-config",
          "NCCL NVLS transport (src/transport/nvls.cc)",
          "Failed to bind NVLink SHARP (NVLS) Multicast memory of size 2097152 : CUDA error 401 'the operation "
          "cannot be performed in the present state'.", "transport/nvls.cc:376"),
    _warn("nvls-cuda", r"nvls\.cc:\d+ NCCL WARN Cuda failure",
          "a CUDA multicast call failed while NCCL set up NVLink SHARP (NVLS): disable NVLS (NCCL_NVLS_ENABLE=0) or "
          "repair the fabric manager", "nccl-error", "fix-config", "NCCL NVLS transport (src/transport/nvls.cc)",
          "Cuda failure 801 'operation not supported'", "transport/nvls.cc:158"),

    # --- host resources NCCL needs
    _warn("shm-segment", r"Error while (?:creating|attaching to) shared memory segment",
          "NCCL could not create its shared-memory segment in /dev/shm: /dev/shm is full or too small (a "
          "container's default 64 MiB): enlarge it or free it", "disk-full", "free-disk",
          "NCCL shared memory (src/misc/shmutils.cc, src/os/linux.cc)",
          "Error while creating shared memory segment /dev/shm/nccl-T1ghWF (size 9637888)", "misc/shmutils.cc:113"),
    _warn("cuda-calloc", r"Failed to CUDA calloc(?: async)? \d+ bytes",
          "NCCL could not allocate its buffers on the GPU: GPU memory ran out (lower the run's memory use, or "
          "NCCL_BUFFSIZE)", "cuda-oom", "fix-config", "NCCL allocator (src/include/alloc.h)",
          "Failed to CUDA calloc 536870912 bytes", "include/alloc.h:186"),
    _warn("duplicate-gpu", r"Duplicate GPU detected : rank \d+ and rank \d+ both on CUDA device",
          "two ranks of one communicator were given the same GPU: fix the run's device assignment (LOCAL_RANK, "
          "CUDA_VISIBLE_DEVICES)", "nccl-error", "fix-config", "NCCL init (src/init.cc)",
          "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 3b000", "init.cc:943"),

    # --- torch's watchdog over collectives
    _torch("watchdog-timeout", r"Watchdog caught collective operation timeout",
           "a collective did not finish within the process group's timeout: a rank hung or died first (diagnose "
           "every host), or the network stalled", "nccl-timeout", "rerun",
           "[rank3]:[E1206 14:46:08.298864673 ProcessGroupNCCL.cpp:632] [Rank 3] Watchdog caught collective operation "
           "timeout: WorkNCCL(SeqNum=10342, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for "
           "600047 milliseconds before timing out."),
    _torch("async-error", r"Some NCCL operations have failed or timed out",
           "torch's NCCL watchdog saw a collective fail or time out and takes the process down (async error "
           "handling): the first failing rank is the cause", "nccl-timeout", "rerun",
           "[rank3]:[E1206 14:46:08.300112785 ProcessGroupNCCL.cpp:2168] [PG ID 0 PG GUID 0(default_pg) Rank 3] Some "
           "NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU "
           "operations might run on corrupted/incomplete data."),
    _torch("heartbeat-timeout", r"Heartbeat monitor timed out|watchdog got stuck for \d+ seconds",
           "torch's NCCL watchdog itself stopped making progress (a CUDA call or collective hung the process), so its "
           "heartbeat monitor killed it: a hung GPU or peer", "nccl-timeout", "rerun",
           "[rank0]:[F1206 14:54:08.410266145 ProcessGroupNCCL.cpp:1550] [PG ID 0 PG GUID 0(default_pg) Rank 0] "
           "Heartbeat monitor timed out! Process will be terminated after dumping debug info. workMetaList_.size()=1"),
)
