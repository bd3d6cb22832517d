/* A library that is no plugin: it has no entry symbol. */
int not_a_plugin(void) { return 0; }
