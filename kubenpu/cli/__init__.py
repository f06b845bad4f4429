"""The command line: kubenpuctl (devices, ioctls, clients, top) and the uninstall hook's rollout
wait; standard library only, no module of the agent."""
