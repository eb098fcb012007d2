"""The elastic job's decision core: pure state machines and rules, no I/O (no clock, thread, socket, process or file).

Every rule takes ``now`` as an argument; what the job wants done is returned as typed actions
(:mod:`.actions`) that the runtime (:mod:`cloud_elastic.driver.runtime`) applies.
"""
