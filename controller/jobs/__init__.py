"""The job service: what the controller does with the jobs users submit, free of Ryu and eventlet. What it needs of
the world it gets through small interfaces handed in (runtime.py); the Ryu apps wire them (controller/apps/).
Issue #22 moves the lifecycle here from controller/apps/placement.py step by step; the seam comes first."""
