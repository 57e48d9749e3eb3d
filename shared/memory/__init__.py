"""Pure domain logic: no bus, no database, no network. Everything here is a function of its inputs."""
