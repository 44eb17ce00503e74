package backup

import (
	"os/exec"
	"syscall"
)

// endWithParent has the kernel kill the replay server when the process that started it dies
// first (the launcher killed mid-replay), so that no etcd is left running on the data dir.
func endWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
