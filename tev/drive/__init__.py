"""What starts the app and drives it from outside: the app server, its load test, a real browser
on the page (page speed, a visitor's workload path, screenshots), and the GPU check that runs the
command line and the test suite on a lent machine."""
