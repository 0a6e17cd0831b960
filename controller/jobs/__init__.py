"""The job service (service.py): what the controller does with the jobs users submit, free of Ryu and eventlet. It is
built from the rack state and the ports it needs (ports.py, runtime.py), handed in by the controller's wiring
(controller/apps/context.py) or by a test."""
