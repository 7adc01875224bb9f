"""{{ groups['all'] | flashfleet_lxc_guests(hostvars, inventory_hostname, gpus) }}: the LXC guests the
inventory maps to a hypervisor (their flashfleet_lxc_host), each {name, ctid, gpus}; a guest without
flashfleet_lxc_gpus gets all of the host's `gpus`. Values are passed on as written: the role's
validation names a wrong one."""

from __future__ import annotations


def flashfleet_lxc_guests(hosts, hostvars, hypervisor, gpus):
    guests = []
    for name in hosts:
        hv = hostvars[name]
        if hv.get("flashfleet_lxc_host") == hypervisor:
            guests.append({"name": name, "ctid": hv.get("flashfleet_lxc_ctid"),
                           "gpus": hv.get("flashfleet_lxc_gpus", list(range(int(gpus))))})
    return guests


class FilterModule:
    def filters(self):
        return {"flashfleet_lxc_guests": flashfleet_lxc_guests}
