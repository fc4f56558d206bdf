// The worker of the launch benchmark: starts and exits at once, so the launcher's own cost is
// all that is measured.
int main() { return 0; }
