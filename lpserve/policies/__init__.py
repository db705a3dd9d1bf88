"""Online policies: baseline engines and routers."""
