"""Jinja filters for the CUDA toolkit / driver compatibility table, whose one home is the project's
flashfleet.cudacompat (NVIDIA's release-notes table and the strict minimum-driver rule)."""

from flashfleet.cudacompat import cuda_driver_ok, cuda_min_driver


class FilterModule:
    def filters(self):
        return {"cuda_min_driver": cuda_min_driver, "cuda_driver_ok": cuda_driver_ok}
