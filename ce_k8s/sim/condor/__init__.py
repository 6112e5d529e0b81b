"""The emulated HTCondor: the condor_job_router emulator, its hook processes and the schedd's queue."""
